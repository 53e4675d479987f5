//! `svc-observe` commands end to end: exact outputs, exit codes, the textfile connector,
//! filtering and subject families, every rendering checked by the real `promtool`.

use crate::support::observe::*;
use crate::support::TempDir;

const CONFIG: &str = r#"{
  "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
  "sink": {"type": "file", "directory": "/tmp/out"},
  "metrics": {"enabled": true, "namespace": "svc", "snapshot_file": "/tmp/snap.json",
              "subject_families": [{"subject": "orders.eu.>", "label": "orders_eu"},
                                   {"subject": "payments.*", "label": "payments"}]}
}"#;

const FAMS: &[(&str, &str)] = &[
    ("orders.eu.>", "orders_eu"),
    ("orders.us.>", "orders_us"),
    ("orders.apac.>", "orders_apac"),
    ("payments.*", "payments"),
    ("secret.>", "restricted"),
];

/// Renders with `--dry-run`, asserting exit 0.
fn dry_run(dir: &TempDir, snap: &str, policy_text: &str) -> String {
    let s = dir.write("snap.json", snap);
    let p = dir.write("policy.json", policy_text);
    let o = observe(&[&"scrape-textfile", &s, &p, &"--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    stdout(&o)
}

fn sample_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn init_validate_show_and_list() {
    let dir = TempDir::new("init");
    let config = dir.write("config.json", CONFIG);
    let policy = dir.join("policy.json");
    let o = observe(&[
        &"init-scrape-policy",
        &config,
        &policy,
        &"--output-file",
        &"/var/lib/prometheus/node-exporter/svc.prom",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "Wrote observability policy {}\nExport stays disabled until the policy enables sharing: set \"enabled\": true and a connector's \"enabled\": true.\n",
            policy.display()
        )
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&policy).unwrap()).unwrap();
    assert_eq!(doc["enabled"], false);
    assert_eq!(
        doc["scrape"]["output_file"],
        "/var/lib/prometheus/node-exporter/svc.prom"
    );
    assert!(doc.get("cloud_b_monitoring").is_none() && doc.get("cloud_c_monitoring").is_none());
    for key in [
        "otlp",
        "search_stack",
        "collector_agent",
        "siem_hec",
        "cloud_a_monitoring",
        "statsd",
        "agent_statsd",
        "syslog",
        "broker_server_monitoring",
        "subject_metrics",
    ] {
        assert_eq!(doc[key]["enabled"], false, "{key}");
    }

    // Never overwritten by accident.
    let o = observe(&[&"init-scrape-policy", &config, &policy]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already exists; pass --force to replace it"));
    let o = observe(&[&"init-scrape-policy", &config, &policy, &"--force"]);
    assert_eq!(o.status.code(), Some(0));

    let o = observe(&[&"validate-policy", &policy]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "Observability policy is valid.\nschema=svc.observability.policy.v1\nenabled=false\nnamespace=svc\n\
         scrape_enabled=false\notlp_enabled=false\nelastic_enabled=false\ncollector_agent_enabled=false\n\
         siem_hec_enabled=false\nstatsd_enabled=false\nbroker_server_monitoring_enabled=false\n\
         broker_server_monitoring_scrape_enabled=false\nallowed_metrics=0\nallowed_metric_patterns=0\n\
         denied_metrics=0\ndenied_metric_patterns=0\nsubjects=3\n"
    );

    let o = observe(&[&"show-effective-policy", &policy]);
    assert_eq!(o.status.code(), Some(0));
    let eff: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(eff["cloud_b_monitoring"]["metric_namespace"], "svc/metrics");
    assert_eq!(eff["cloud_c_monitoring"]["verify_tls"], true);
    assert_eq!(eff["scrape"]["http_endpoint"]["port"], 9108);

    let o = observe(&[&"list-subjects", &policy, &"--format", &"shell"]);
    assert_eq!(
        stdout(&o),
        "SVC_SUBJECT_0_ORDERS_REST='orders.>'\nSVC_SUBJECT_1_ORDERS_EU_REST='orders.eu.>'\nSVC_SUBJECT_2_PAYMENTS_ANY='payments.*'\n"
    );
    // The shell output is safe to evaluate.
    let sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{}\nprintf %s \"$SVC_SUBJECT_0_ORDERS_REST\"",
            stdout(&o)
        ))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&sh.stdout), "orders.>");

    let o = observe(&[&"list-metrics", &"--format", &"names"]);
    let names = stdout(&o);
    assert!(names.lines().any(|l| l == "messages_acked_total"));
    assert!(names.lines().any(|l| l == "sink_batch_write_seconds"));
    assert!(names.lines().any(|l| l == "messages_processed_total"));
}

#[test]
fn invalid_inputs_exit_2_with_every_problem() {
    let dir = TempDir::new("invalid");
    let p = dir.write(
        "policy.json",
        r#"{"schema": "svc.observability.policy.v1", "namespace": "bad-name",
            "siem_hec": {"verify_tls": false},
            "otlp": {"endpoint": "https://user:hunter2@otlp.example/v1/metrics"},
            "subject_metrics": {"rules": [{"subject": "orders.>"}]}}"#,
    );
    let o = observe(&[&"validate-policy", &p]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        "Observability policy is invalid:\n\
         \x20 namespace: must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes\n\
         \x20 subject_metrics.rules[0].label: is required for an allow rule\n\
         \x20 otlp.endpoint: must not contain credentials; use the connector's environment-variable fields\n\
         \x20 siem_hec.verify_tls: must be true; TLS verification cannot be disabled\n"
    );
    assert!(!stderr(&o).contains("hunter2"));
    for cmd in ["show-effective-policy", "list-subjects"] {
        assert_eq!(observe(&[&cmd, &p]).status.code(), Some(2), "{cmd}");
    }
    let missing = dir.join("nope.json");
    let o = observe(&[&"validate-policy", &missing]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read policy"));
    // Usage errors.
    assert_eq!(observe(&[&"frobnicate"]).status.code(), Some(2));
    assert_eq!(observe(&[]).status.code(), Some(2));
    // An invalid runtime config.
    let bad = dir.write("config.json", r#"{"nats": {}}"#);
    let o = observe(&[&"init-scrape-policy", &bad, &dir.join("new.json")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("nats.stream: is required"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("new.json").exists());
}

#[test]
fn help_and_version_everywhere() {
    let o = observe(&[&"--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("svc-observe: export"));
    assert!(
        stdout(&o).contains("Exit codes: 0 success, 1 runtime failure, 2 invalid input or policy.")
    );
    for cmd in [
        "init-scrape-policy",
        "validate-policy",
        "show-effective-policy",
        "list-metrics",
        "list-subjects",
        "scrape-textfile",
        "scrape-http",
    ] {
        let o = observe(&[&cmd, &"--help"]);
        assert_eq!(o.status.code(), Some(0), "{cmd}");
        assert!(
            stdout(&o).starts_with(&format!("Usage: svc-observe {cmd}")),
            "{cmd}"
        );
        let o = observe(&[&cmd, &"--version"]);
        assert_eq!(
            stdout(&o),
            format!("svc-observe {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn disabled_policy_writes_one_comment_line_without_a_snapshot() {
    let dir = TempDir::new("disabled");
    let out = dir.join("svc.prom");
    let no_snapshot = dir.join("missing.json");
    for (policy_text, reason) in [
        (
            r#"{"schema": "svc.observability.policy.v1"}"#.to_string(),
            "enabled=false",
        ),
        (
            policy(r#"{"scrape": {"enabled": false}}"#),
            "scrape.enabled=false",
        ),
    ] {
        let p = dir.write("policy.json", &policy_text);
        let o = observe(&[&"scrape-textfile", &no_snapshot, &p, &"--output", &out]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(
            text,
            format!("# svc-observe: metrics export is disabled by policy ({reason})\n")
        );
        assert_promtool_clean(&text);
        let o = observe(&[&"scrape-textfile", &no_snapshot, &p, &"--dry-run"]);
        assert_eq!(stdout(&o), text);
    }
    // The HTTP endpoint: no listener, exit 0, and the dry run prints the comment.
    let p = dir.write(
        "policy.json",
        r#"{"schema": "svc.observability.policy.v1"}"#,
    );
    let o = observe(&[&"scrape-http", &no_snapshot, &p]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stderr(&o)
        .contains("the HTTP endpoint is disabled by policy (enabled=false); not listening"));
    let o = observe(&[&"scrape-http", &no_snapshot, &p, &"--dry-run"]);
    assert_eq!(
        stdout(&o),
        "# svc-observe: metrics export is disabled by policy (enabled=false)\n"
    );
}

/// The end state (promtool-clean, no temporary file left). That a reader never sees a torn
/// file while `write_atomically` replaces it is proven by a concurrent reader in
/// `metrics::snapshot::tests::a_concurrent_reader_never_sees_a_torn_file`.
#[test]
fn textfile_is_written_atomically_and_promtool_clean() {
    let dir = TempDir::new("textfile");
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let out = dir.join("svc.prom");
    let p = dir.write(
        "policy.json",
        &policy(&format!(
            r#"{{"include_legacy": true, "scrape": {{"output_file": "{}"}},
                "subject_metrics": {{"enabled": true, "rules": [{{"subject": "orders.>", "label": "orders"}},
                                                              {{"subject": "payments.*", "label": "payments"}}]}}}}"#,
            out.display()
        )),
    );
    let o = observe(&[&"scrape-textfile", &snap, &p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_promtool_clean(&text);
    assert!(text.ends_with('\n'));
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 3, "no temporary file left: {entries:?}");

    let lines = sample_lines(&text);
    // Counters end in _total; every summary value is exported; the gauge is there.
    let fetched = format!(
        "svc_messages_fetched_total {}",
        counter_value("messages_fetched_total")
    );
    assert!(lines.contains(&fetched.as_str()), "{text}");
    assert!(text.contains("# HELP svc_messages_acked_total Messages acknowledged after durable success or DLQ success.\n# TYPE svc_messages_acked_total counter\n"));
    for part in ["_count 3", "_sum 2.75", "_min 0.25", "_max 2", "_last 2"] {
        assert!(
            lines.contains(&format!("svc_sink_batch_write_seconds{part}").as_str()),
            "{part}\n{text}"
        );
    }
    assert!(text.contains("# TYPE svc_sink_batch_write_seconds summary\n"));
    assert!(text.contains("# TYPE svc_sink_batch_write_seconds_max gauge\n"));
    assert!(lines.contains(&"svc_last_sink_success_epoch_seconds 1700000000"));
    // Legacy alias with its target's value.
    let alias = format!(
        "svc_messages_processed_total {}",
        counter_value("messages_acked_total")
    );
    assert!(lines.contains(&alias.as_str()), "{text}");
    // Families: orders_eu/us/apac summed under the reviewed label; restricted: no rule.
    assert!(
        lines.contains(&"svc_messages_written_total{subject_family=\"orders\"} 60"),
        "{text}"
    );
    assert!(lines.contains(&"svc_messages_written_total{subject_family=\"payments\"} 40"));
    assert!(lines.contains(&"svc_messages_fetched_total{subject_family=\"orders\"} 66"));
    assert!(!text.contains("restricted"));
    // No raw subject, pattern or family label of the runner appears.
    for raw in ["orders.", "orders_eu", "payments.*", "secret"] {
        assert!(!text.contains(raw), "{raw} leaked:\n{text}");
    }
}

#[test]
fn filtering_rules() {
    let dir = TempDir::new("filter");
    let snap = snapshot(&[], 0.0);
    // Empty allow lists render nothing.
    let text = dry_run(&dir, &snap, &policy(r#"{"allowed_metric_patterns": []}"#));
    assert_eq!(text, "");
    assert_promtool_clean(&text);
    // Names + globs, deny wins, observations and legacy need their switches.
    let text = dry_run(
        &dir,
        &snap,
        &policy(
            r#"{"allowed_metrics": ["sink_batch_write_seconds", "messages_processed_total", "db_duplicates_total"],
                "allowed_metric_patterns": ["messages_*ed_total"],
                "denied_metrics": ["messages_nacked_total"],
                "denied_metric_patterns": ["db_*"],
                "include_observations": false}"#,
        ),
    );
    assert_promtool_clean(&text);
    let names: Vec<&str> = sample_lines(&text)
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "svc_messages_acked_total",
            "svc_messages_failed_total",
            "svc_messages_fetched_total",
            "svc_messages_prepared_total",
            "svc_messages_terminated_total",
        ]
    );
    // With the switches: the observation and the alias appear.
    let text = dry_run(
        &dir,
        &snap,
        &policy(
            r#"{"allowed_metrics": ["sink_batch_write_seconds", "messages_processed_total"],
                "include_observations": true, "include_legacy": true, "namespace": "shop"}"#,
        ),
    );
    assert_promtool_clean(&text);
    assert!(text.contains("shop_sink_batch_write_seconds_count 3\n"));
    assert!(text.contains(
        "# HELP shop_messages_processed_total Legacy alias of shop_messages_acked_total."
    ));
    // Deny of the target wins through the alias.
    let text = dry_run(
        &dir,
        &snap,
        &policy(
            r#"{"allowed_metrics": ["messages_processed_total"], "allowed_metric_patterns": [], "include_legacy": true, "denied_metrics": ["messages_acked_total"]}"#,
        ),
    );
    assert_eq!(text, "");
}

#[test]
fn help_and_type_switches() {
    let dir = TempDir::new("switches");
    let snap = snapshot(FAMS, 0.0);
    let text = dry_run(
        &dir,
        &snap,
        &policy(r#"{"scrape": {"include_type": false}}"#),
    );
    assert!(!text.contains("# TYPE") && text.contains("# HELP"));
    // Without TYPE every series is untyped and carries its own HELP: promtool stays clean.
    assert!(text.contains("# HELP svc_sink_batch_write_seconds_count "));
    assert_promtool_clean(&text);
    let text = dry_run(
        &dir,
        &snap,
        &policy(r#"{"scrape": {"include_help": false}}"#),
    );
    assert!(!text.contains("# HELP") && text.contains("# TYPE"));
    // promtool's lint asks for HELP on every metric: switching HELP off is the operator's
    // choice and its only findings are those.
    let (code, findings) = promtool(&text);
    assert_eq!(code, 3);
    assert!(
        findings.lines().all(|l| l.ends_with("no help text")),
        "{findings}"
    );
}

#[test]
fn subject_family_display_modes_and_precedence() {
    let dir = TempDir::new("modes");
    let snap = snapshot(FAMS, 0.0);
    let written = |text: &str| -> Vec<String> {
        sample_lines(text)
            .into_iter()
            .filter(|l| l.starts_with("svc_messages_written_total{"))
            .map(str::to_string)
            .collect()
    };
    // A deny rule wins even after an allow rule that covers the family; overlap is enough.
    let text = dry_run(
        &dir,
        &snap,
        &policy(
            r#"{"subject_metrics": {"enabled": true, "rules": [
                 {"subject": "orders.>", "label": "orders"},
                 {"subject": "orders.us.>", "action": "deny"},
                 {"subject": "payments.*", "label": "payments", "display_mode": "hash"},
                 {"subject": ">", "label": "all", "display_mode": "redacted"}]}}"#,
        ),
    );
    assert_promtool_clean(&text);
    let hash = svc::observe::families::short_hash("payments.*");
    assert_eq!(
        written(&text),
        [
            "svc_messages_written_total{subject_family=\"orders\"} 40".to_string(),
            format!("svc_messages_written_total{{subject_family=\"{hash}\"}} 40"),
            "svc_messages_written_total{subject_family=\"redacted\"} 50".to_string(),
        ]
    );
    // Raw shows the family's reviewed pattern, only with allow_raw_subjects.
    let text = dry_run(
        &dir,
        &snap,
        &policy(
            r#"{"subject_metrics": {"enabled": true, "allow_raw_subjects": true, "rules": [
                 {"subject": "payments.*", "label": "payments", "display_mode": "raw",
                  "allowed_metrics": ["messages_written_total"]}]}}"#,
        ),
    );
    assert_promtool_clean(&text);
    assert_eq!(
        written(&text),
        ["svc_messages_written_total{subject_family=\"payments.*\"} 40"]
    );
    assert!(
        !text.contains("svc_messages_acked_total{"),
        "rule metric list applies"
    );
    // default_action deny: no rule, no rows; subject_metrics disabled: no rows.
    for extra in [
        r#"{"subject_metrics": {"enabled": true}}"#,
        r#"{"subject_metrics": {"enabled": false, "rules": [{"subject": ">", "label": "all"}]}}"#,
    ] {
        let text = dry_run(&dir, &snap, &policy(extra));
        assert!(!text.contains("subject_family"), "{extra}");
    }
}

#[test]
fn subject_family_overflow_modes() {
    let dir = TempDir::new("overflow");
    let snap = snapshot(FAMS, 0.0);
    let rules = r#"[{"subject": "orders.eu.>", "label": "eu"}, {"subject": "orders.us.>", "label": "us"},
                    {"subject": "orders.apac.>", "label": "apac"}, {"subject": "payments.*", "label": "pay"},
                    {"subject": "secret.>", "label": "sec"}]"#;
    let labels = |text: &str| -> Vec<String> {
        sample_lines(text)
            .into_iter()
            .filter(|l| l.starts_with("svc_messages_written_total{"))
            .map(str::to_string)
            .collect()
    };
    let text = dry_run(
        &dir,
        &snap,
        &policy(&format!(
            r#"{{"subject_metrics": {{"enabled": true, "max_subject_families": 2, "rules": {rules}}}}}"#
        )),
    );
    assert_promtool_clean(&text);
    assert_eq!(
        labels(&text),
        [
            "svc_messages_written_total{subject_family=\"eu\"} 10",
            "svc_messages_written_total{subject_family=\"us\"} 20",
        ]
    );
    let text = dry_run(
        &dir,
        &snap,
        &policy(&format!(
            r#"{{"subject_metrics": {{"enabled": true, "max_subject_families": 2, "overflow_action": "aggregate_other", "overflow_label": "rest", "rules": {rules}}}}}"#
        )),
    );
    assert_promtool_clean(&text);
    assert_eq!(
        labels(&text),
        [
            "svc_messages_written_total{subject_family=\"eu\"} 10",
            "svc_messages_written_total{subject_family=\"us\"} 20",
            "svc_messages_written_total{subject_family=\"rest\"} 120",
        ]
    );
    // fail_closed: nothing is exported, the file is replaced by the withheld marker, exit 1.
    let s = dir.write("snap.json", &snap);
    let out = dir.join("svc.prom");
    std::fs::write(&out, "svc_old_total 1\n").unwrap();
    let p = dir.write(
        "policy.json",
        &policy(&format!(
            r#"{{"subject_metrics": {{"enabled": true, "max_subject_families": 2, "overflow_action": "fail_closed", "rules": {rules}}}}}"#
        )),
    );
    let o = observe(&[&"scrape-textfile", &s, &p, &"--output", &out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("5 family labels exceed max_subject_families 2"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "# svc-observe: metrics withheld (subject-family overflow)\n"
    );
    let o = observe(&[&"scrape-textfile", &s, &p, &"--dry-run"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "");
    // Within the limit fail_closed renders normally.
    let p = dir.write(
        "policy.json",
        &policy(&format!(
            r#"{{"subject_metrics": {{"enabled": true, "max_subject_families": 5, "overflow_action": "fail_closed", "rules": {rules}}}}}"#
        )),
    );
    assert_eq!(
        observe(&[&"scrape-textfile", &s, &p, &"--output", &out])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(labels(&std::fs::read_to_string(&out).unwrap()).len(), 5);
}

#[test]
fn stale_missing_and_invalid_snapshots_fail_closed() {
    let dir = TempDir::new("stale");
    let out = dir.join("svc.prom");
    let p = dir.write(
        "policy.json",
        &policy(r#"{"scrape": {"stale_after_seconds": 30}}"#),
    );
    let s = dir.write("snap.json", &snapshot(&[], 120.0));
    let o = observe(&[&"scrape-textfile", &s, &p, &"--output", &out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("snapshot is stale"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "# svc-observe: metrics withheld (snapshot stale)\n"
    );
    let o = observe(&[
        &"scrape-textfile",
        &s,
        &p,
        &"--output",
        &out,
        &"--allow-stale",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let acked = format!(
        "svc_messages_acked_total {}\n",
        counter_value("messages_acked_total")
    );
    assert!(std::fs::read_to_string(&out).unwrap().contains(&acked));

    let o = observe(&[
        &"scrape-textfile",
        &dir.join("missing.json"),
        &p,
        &"--output",
        &out,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "# svc-observe: metrics withheld (snapshot unavailable)\n"
    );
    let bad = dir.write("bad.json", r#"{"schema": "other"}"#);
    let o = observe(&[&"scrape-textfile", &bad, &p, &"--output", &out]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "# svc-observe: metrics withheld (snapshot invalid)\n"
    );
    // No destination at all is invalid input.
    let o = observe(&[&"scrape-textfile", &s, &p]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pass --output or set scrape.output_file"));
}

/// Standard output as `svc` treats it: a reader that left (`svc-observe list-metrics | head`)
/// ends the command quietly with the shell's SIGPIPE status (141), and a full output (a full
/// disk behind a redirection) is said, exit 1, never reported as success.
#[test]
fn a_closed_or_full_standard_output_is_not_success() {
    use std::process::{Command, Stdio};
    for args in [vec!["list-metrics"], vec!["--help"]] {
        let (read, write) = std::io::pipe().unwrap();
        drop(read);
        let o = Command::new(bin())
            .args(&args)
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(stderr(&o), "", "{args:?}");
        assert_eq!(o.status.code(), Some(141), "{args:?}");

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(bin())
            .args(&args)
            .stdout(Stdio::from(full))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).starts_with("svc-observe: cannot write to standard output:"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}
