//! The operator commands of `svc` and what a newcomer meets first: each command's own help,
//! the command list, configuration problems that point at the fix, the `validate` summary, a
//! broker failure that names the server and is printed once, `show-effective-config`'s round
//! trip, and `inspect` against a real nats-server (one per test, from `util`).

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const COMMANDS: &[&str] = &[
    "validate",
    "show-effective-config",
    "run",
    "inspect",
    "replay",
    "stream-plan",
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
            "mission_metadata",
            "pre_sink_policy",
            "size_policy",
            "dead_letter",
            "payload_encryption",
            "authenticity",
            "custody",
            "spool"
        ]
    );

    // Invalid: the same problems and exit code as validate, nothing on stdout.
    c["delivery"] = json!({"batch_sise": 5});
    let bad = write_config(dir.path(), "bad.json", &c);
    let shown = svc(&["show-effective-config", bad.to_str().unwrap()]);
    let validated = svc(&["validate", bad.to_str().unwrap()]);
    assert_eq!(shown, (2, String::new(), validated.2));
}

const HMAC_ENV: &str = "INSPECT_TEST_HMAC";

/// A stream of 6 messages (sequence 1 to 6), a durable consumer nobody reads, and a config
/// with a fan-out sink routing `orders.eu.>` to `eu` only, and authenticity required on
/// `orders.signed.>`.
fn inspect_setup(dir: &std::path::Path) -> (NatsServer, std::path::PathBuf) {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer(
        "ORDERS",
        "svc",
        "orders.>",
        std::time::Duration::from_secs(30),
    );
    let secret = "Bearer inspect-secret-value-123";
    for (subject, prio) in [
        ("orders.eu.created", "high"),
        ("orders.us.created", "low"),
        ("orders.eu.paid", "high"),
        ("orders.us.paid", "normal"),
        ("orders.signed.x", "normal"),
        ("orders.eu.closed", "low"),
    ] {
        server.publish_with_headers(
            subject,
            &[
                ("Svc-Priority", prio),
                ("Authorization", secret),
                ("X-Trace", "t-1"),
            ],
            format!("{{\"subject\": \"{subject}\"}}").as_bytes(),
        );
    }
    let cfg = json!({
        "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
        "sink": {"type": "fanout",
                 "sinks": {"eu": {"type": "file", "directory": dir.join("eu")},
                           "all": {"type": "file", "directory": dir.join("all")}},
                 "routing": {"enabled": true, "unmatched": "all_required",
                             "target_sink_types": {"eu": "file", "all": "file"},
                             "routes": [{"name": "eu", "match": {"subject": "orders.eu.>"},
                                         "targets": ["eu"]}]}},
        "authenticity": {"enabled": true,
                         "keys": [{"key_id": "h1", "secret_env": HMAC_ENV}],
                         "rules": [{"subject": "orders.signed.>", "required": true}]}
    });
    let path = write_config(dir, "c.json", &cfg);
    (server, path)
}

/// `svc inspect` with the test's HMAC key in the environment.
fn inspect(args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("inspect")
        .args(args)
        .env(HMAC_ENV, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn jsonl(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn sequences(lines: &[serde_json::Value]) -> Vec<u64> {
    lines
        .iter()
        .map(|v| v["stream_sequence"].as_u64().unwrap())
        .collect()
}

/// Waits until the stream holds exactly `n` consumers.
fn wait_consumers(server: &NatsServer, n: usize, within: std::time::Duration) {
    wait_until(within, &format!("{n} consumer(s) on ORDERS"), || {
        server
            .js()
            .stream_info("ORDERS")
            .map(|i| i.state.consumer_count == n)
            .unwrap_or(false)
    });
}

#[test]
fn inspect_shows_what_the_runner_would_make_of_each_message_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, cfg) = inspect_setup(dir.path());
    let cfg = cfg.to_str().unwrap();
    let durable_before = server.consumer_state("ORDERS", "svc");

    let (code, out, err) = inspect(&[cfg, "--last", "3", "--format", "jsonl"]);
    assert_eq!(code, 0, "{err}");
    let lines = jsonl(&out);
    assert_eq!(sequences(&lines), [4, 5, 6]);
    let first = &lines[0];
    assert_eq!(first["subject"], "orders.us.paid");
    assert_eq!(first["payload_format"], "json");
    assert_eq!(first["metadata"]["priority"], "normal");
    assert_eq!(
        first["fanout"],
        json!(["all", "eu"]),
        "unmatched: every child"
    );
    assert_eq!(lines[2]["fanout"], json!(["eu"]));
    assert_eq!(lines[2]["fanout_route"], "route eu");
    assert!(
        first["fanout_route"]
            .as_str()
            .unwrap()
            .starts_with("every child"),
        "{first}"
    );
    assert_eq!(first["authenticity"], "unsigned (not required)");
    assert!(
        lines[1]["authenticity"]
            .as_str()
            .unwrap()
            .starts_with("rejected: authenticity: the subject requires a signature"),
        "{}",
        lines[1]
    );
    assert!(first["time"].as_str().unwrap().ends_with('Z'), "{first}");
    assert!(
        first.get("payload").is_none(),
        "payloads only with --payload"
    );
    assert!(first["headers"]
        .as_array()
        .unwrap()
        .contains(&json!(["Authorization", "<redacted>"])));
    assert!(first["headers"]
        .as_array()
        .unwrap()
        .contains(&json!(["X-Trace", "t-1"])));
    assert!(!out.contains("inspect-secret-value"), "{out}");

    // Other starts, a narrower subject, payloads, the text format.
    let (_, out, _) = inspect(&[cfg, "--start-seq", "2", "--max", "2", "--format", "jsonl"]);
    assert_eq!(sequences(&jsonl(&out)), [2, 3]);
    let (_, out, _) = inspect(&[
        cfg,
        "--since",
        "2000-01-01T00:00:00Z",
        "--max",
        "50",
        "--subject",
        "orders.eu.>",
        "--format",
        "jsonl",
        "--payload",
    ]);
    let eu = jsonl(&out);
    assert_eq!(sequences(&eu), [1, 3, 6]);
    assert_eq!(eu[0]["payload"], "{\"subject\": \"orders.eu.created\"}");
    let (code, out, _) = inspect(&[cfg, "--subject", "payments.>"]);
    assert_eq!(code, 2, "{out}");
    let (code, out, err) = inspect(&[cfg, "--last", "2"]);
    assert_eq!(code, 0, "{err}");
    let text: Vec<&str> = out.lines().collect();
    assert_eq!(text.len(), 3, "{out}");
    assert!(
        text[0].starts_with("#5 ") && text[0].contains(" orders.signed.x "),
        "{out}"
    );
    assert!(
        text[1].contains(" high/unclassified [] ") || text[1].contains(" low/unclassified [] "),
        "{out}"
    );
    assert!(
        text[1].contains("fanout=eu") && text[1].contains("Authorization=<redacted>"),
        "{out}"
    );
    assert_eq!(text[2], "(2 messages read)");

    // Nothing acknowledged, the durable untouched, no consumer left behind.
    assert_eq!(server.consumer_state("ORDERS", "svc"), durable_before);
    wait_consumers(&server, 1, std::time::Duration::from_secs(10));
}

/// A killed `svc inspect` leaves no consumer behind: the broker drops it once nobody listens.
#[test]
fn a_killed_inspect_leaves_no_consumer_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (server, cfg) = inspect_setup(dir.path());
    // Enough output to fill the pipe nobody reads: the process blocks alive with its consumer.
    let big = "x".repeat(2000);
    let js = server.js();
    for _ in 0..200 {
        js.publish("orders.eu.bulk", big.as_bytes()).unwrap();
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args([
            "inspect",
            cfg.to_str().unwrap(),
            "--start-seq",
            "1",
            "--max",
            "10000",
        ])
        .args(["--payload", "--timeout", "60"])
        .env(HMAC_ENV, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_consumers(&server, 2, std::time::Duration::from_secs(10));
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = std::time::Instant::now();
    // 5 s of inactivity, plus the broker's sweep.
    wait_consumers(&server, 1, std::time::Duration::from_secs(30));
    eprintln!("consumer gone {:?} after the kill", killed.elapsed());
}

/// What a terminal must never receive raw: C0, DEL, C1, bidi embeddings, overrides, isolates
/// and marks, the line and paragraph separators.
fn raw_terminal_controls(text: &str) -> Vec<String> {
    text.chars()
        .filter(|c| {
            (c.is_control() && *c != '\n')
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
                               | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

/// `svc inspect` against a hostile publisher: every terminal control escaped in both formats
/// (jsonl with JSON escapes, the same values for a parser), a header whose name carries a key
/// redacted, and a message the runner dead-letters at its input check (300 header lines) shown
/// as refused there, never as `governance=stored`.
#[test]
fn inspect_escapes_every_terminal_control_and_runs_the_input_check_first() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer(
        "ORDERS",
        "svc",
        "orders.>",
        std::time::Duration::from_secs(30),
    );
    let note = "a\u{202e}b\u{2066}c\u{200e}d\u{200f}e\u{61c}f\u{9b}31mg\u{9d}h\u{7f}i\u{2028}j";
    let payload = "{\"t\":\"\u{9b}2J\u{7f}\u{2029}\u{202a}\"}";
    server.raw_publish(
        b"orders.eu.created",
        &[
            (b"X-Note", note.as_bytes()),
            (b"X-Auth-Key", b"k-inspect-secret-4711"),
        ],
        payload.as_bytes(),
    );
    let many: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
        .map(|i| (format!("X-H{i}").into_bytes(), b"v".to_vec()))
        .collect();
    let many: Vec<(&[u8], &[u8])> = many.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    server.raw_publish(b"orders.eu.created", &many, b"{}");
    let cfg = json!({
        "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
        "sink": {"type": "file", "directory": dir.path().join("out")},
        "size_policy": {"enabled": true, "max_payload_bytes": 1_000_000}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let cfg = cfg.to_str().unwrap();

    let (code, out, err) = inspect(&[cfg, "--format", "jsonl", "--payload", "--max", "2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(raw_terminal_controls(&out), Vec::<String>::new(), "{out}");
    assert!(
        out.contains("\\u009b31m") && out.contains("\\u202e"),
        "{out}"
    );
    let lines = jsonl(&out);
    assert_eq!(sequences(&lines), [1, 2]);
    let headers = lines[0]["headers"].as_array().unwrap();
    assert!(headers.contains(&json!(["X-Note", note])), "{headers:?}");
    assert!(
        headers.contains(&json!(["X-Auth-Key", "<redacted>"])),
        "{headers:?}"
    );
    assert_eq!(lines[0]["payload"], payload);
    assert_eq!(lines[0]["input"]["verdict"], "accepted");
    assert_eq!(lines[0]["governance"]["verdict"], "stored");
    assert_eq!(
        lines[1]["input"]["reason"], "too_many_headers",
        "{}",
        lines[1]
    );
    assert_ne!(lines[1]["governance"]["verdict"], "stored", "{}", lines[1]);
    assert!(!out.contains("k-inspect-secret-4711"));

    let (code, out, err) = inspect(&[cfg, "--payload", "--max", "2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(raw_terminal_controls(&out), Vec::<String>::new(), "{out}");
    let text: Vec<&str> = out.lines().collect();
    assert!(text[0].contains("X-Note=a\\u{202e}b"), "{out}");
    assert!(text[0].contains("governance=stored"), "{out}");
    assert!(
        text[1].contains("input refused too_many_headers")
            && !text[1].contains("governance=stored"),
        "{out}"
    );
}

/// `svc spool inspect` of records a hostile publisher chose (a subject with a bidi override, a
/// payload with C1 controls, separators and a 100,000-character string): no raw terminal
/// control, and no line longer than the string bound allows.
#[test]
fn spool_inspect_escapes_terminal_controls_and_bounds_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer(
        "ORDERS",
        "svc",
        "orders.>",
        std::time::Duration::from_secs(30),
    );
    let long = "x".repeat(100_000);
    let payload = format!("{{\"t\":\"\u{9b}2J\u{202e}\u{2066}\u{2028}\",\"long\":\"{long}\"}}");
    server.raw_publish(
        "orders.\u{202e}gpj.exe".as_bytes(),
        &[(b"Nats-Msg-Id", "id-\u{9d}\u{200f}".as_bytes())],
        payload.as_bytes(),
    );
    server.raw_publish(b"orders.plain", &[], b"{\"ok\":1}");
    let cfg = json!({
        "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
        "delivery": {"fetch_expiry_ms": 200},
        "sink": {"type": "spool", "dir": dir.path().join("spool"), "max_bytes": 64 << 20,
                 "allow_unencrypted": true,
                 "target": {"type": "file", "directory": dir.path().join("out")}}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("run.log"));
    wait_until(std::time::Duration::from_secs(30), "both spooled", || {
        server
            .try_consumer_state("ORDERS", "svc")
            .is_some_and(|s| s.0 >= 2)
    });
    runner.signal("TERM");
    runner
        .wait_timeout(std::time::Duration::from_secs(20))
        .expect("exits");
    let cfg = cfg.to_str().unwrap();
    for args in [
        vec!["spool", "inspect", cfg],
        vec!["spool", "inspect", cfg, "--payload"],
    ] {
        let (code, out, err) = svc(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(raw_terminal_controls(&out), Vec::<String>::new(), "{out}");
        let lines: Vec<serde_json::Value> = jsonl(&out);
        assert_eq!(lines.len(), 3, "two records and the summary: {out}");
        assert_eq!(lines[2]["state"], "summary", "{out}");
        assert_eq!(lines[0]["subject"], "orders.\u{202e}gpj.exe");
        assert!(out.contains("orders.\\u202egpj.exe"), "{out}");
        let longest = out.lines().map(str::len).max().unwrap();
        assert!(longest < 4096, "a line of {longest} bytes");
    }
}
