//! `contrib/prometheus/`: the rules pass `promtool check rules`, their unit tests pass
//! `promtool test rules` (every alert with a firing and a silent case), every runner metric
//! they name is one the exporter really serves, and the exporter alerts go pending on the
//! files a real `svc-observe` writes when it withholds, served by a real node exporter to a
//! real Prometheus.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::kit::*;
use crate::support::observe::{get10, observe, policy, wait_for, ChildGuard};
use crate::support::{free_port, TempDir};

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo("contrib/prometheus"))
        .output()
        .expect("promtool is installed (Debian package prometheus)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn rules_text() -> String {
    std::fs::read_to_string(repo("contrib/prometheus/svc-rules.yml")).unwrap()
}

fn alert_names() -> Vec<String> {
    rules_text()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn promtool_check_rules_is_clean() {
    let (ok, text) = promtool(&["check", "rules", "svc-rules.yml"]);
    assert!(ok, "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
    assert!(!text.contains("WARNING"), "{text}");
}

#[test]
fn promtool_unit_tests_pass() {
    let (ok, text) = promtool(&["test", "rules", "svc-rules.test.yml"]);
    assert!(ok, "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// Each alert is tested both ways: at least one case expecting it and one expecting silence.
#[test]
fn every_alert_has_a_firing_and_a_silent_case() {
    let tests = std::fs::read_to_string(repo("contrib/prometheus/svc-rules.test.yml")).unwrap();
    // (fires, silent) per alert name. A case is either the one-line flow form
    // `{eval_time: .., alertname: X, exp_alerts: []}` or a block whose `alertname: X` line is
    // followed by `exp_alerts: []` (silent) or `exp_alerts:` with items (firing).
    let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let lines: Vec<&str> = tests.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some(rest) = l.split("alertname: ").nth(1) else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let silent = if l.contains("exp_alerts") {
            l.contains("exp_alerts: []")
        } else {
            lines[i + 1].trim() == "exp_alerts: []"
        };
        let e = seen.entry(name).or_default();
        if silent {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    let alerts = alert_names();
    assert!(alerts.len() >= 15, "{alerts:?}");
    for a in &alerts {
        let (fires, silent) = seen.get(a).copied().unwrap_or_default();
        assert!(
            fires > 0 && silent > 0,
            "{a}: {fires} firing, {silent} silent cases"
        );
    }
    for name in seen.keys() {
        assert!(
            alerts.contains(name),
            "the tests name an unknown alert {name}"
        );
    }
}

/// A rule on a misspelt metric never fires; the names must be the exporter's.
#[test]
fn rules_name_only_metrics_the_exporter_serves() {
    let served = exported_names();
    let used = svc_names(&rules_text());
    assert!(used.contains("svc_messages_acked_total"), "{used:?}");
    assert!(
        used.contains("svc_sink_batch_write_seconds_sum"),
        "{used:?}"
    );
    for name in &used {
        assert!(
            served.contains(name),
            "{name} is not a metric svc-observe serves"
        );
    }
}

/// State ("inactive", "pending", "firing") and alert labels of each alerting rule.
fn alert_states(addr: SocketAddr) -> Option<BTreeMap<String, (String, Vec<serde_json::Value>)>> {
    let (status, body) = get10(addr, "/api/v1/rules?type=alert")?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut out = BTreeMap::new();
    for g in v["data"]["groups"].as_array()? {
        for r in g["rules"].as_array()? {
            // Rules not yet evaluated report no health; wait for every one.
            if r["health"] != "ok" {
                return None;
            }
            out.insert(
                r["name"].as_str()?.to_string(),
                (
                    r["state"].as_str()?.to_string(),
                    r["alerts"].as_array().cloned().unwrap_or_default(),
                ),
            );
        }
    }
    (!out.is_empty()).then_some(out)
}

#[test]
fn exporter_alerts_catch_what_svc_observe_really_writes() {
    let dir = TempDir::new("alerts");
    let textdir = dir.join("textfile");
    std::fs::create_dir_all(&textdir).unwrap();
    // A policy that shares everything, with a broker poll aimed at a port nobody listens on.
    let mut p: serde_json::Value = serde_json::from_str(&policy("{}")).unwrap();
    p["broker_server_monitoring"] = serde_json::json!({
        "enabled": true, "scrape_enabled": true,
        "base_url": format!("http://127.0.0.1:{}", free_port()),
        "allowed_endpoints": ["/varz"], "allowed_fields": ["mem"]});
    let pol = dir.write("policy.json", &p.to_string());
    // No snapshot: the textfile export withholds the runner's metrics (exit 1).
    let svc_prom = textdir.join("svc.prom");
    let o = observe(&[
        &"scrape-textfile",
        &dir.join("missing.json"),
        &pol,
        &"--output",
        &svc_prom,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(std::fs::read_to_string(&svc_prom)
        .unwrap()
        .starts_with("# svc-observe: metrics withheld (snapshot unavailable)"));
    // The broker poll fails: its file is replaced by the withheld marker (exit 1).
    let broker_prom = textdir.join("svc-broker.prom");
    let o = observe(&[&"broker-monitoring-poll", &pol, &"--output", &broker_prom]);
    assert_eq!(o.status.code(), Some(1));
    assert!(std::fs::read_to_string(&broker_prom)
        .unwrap()
        .contains("withheld (poll failed)"));

    let node_port = free_port();
    let _node = ChildGuard(
        Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{node_port}"))
            .args(["--collector.disable-defaults", "--collector.textfile"])
            .arg(format!(
                "--collector.textfile.directory={}",
                textdir.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-node-exporter is installed"),
    );
    // The HTTP endpoint's job, with nothing listening (the policy-disabled case).
    let closed = free_port();
    let prom_port = free_port();
    let conf = dir.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n\
             \x20 - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{node_port}']\n\
             \x20 - job_name: svc-observe\n    static_configs:\n      - targets: ['127.0.0.1:{closed}']\n",
            repo("contrib/prometheus/svc-rules.yml").display()
        ),
    );
    let _prom = ChildGuard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed"),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], prom_port));
    let expected = [
        ("SvcMetricsWithheld", Some("svc.prom")),
        ("SvcBrokerMonitoringPollFailed", Some("svc-broker.prom")),
        ("SvcMetricsEndpointDown", None),
        ("SvcMetricsAbsent", None),
    ];
    let states = wait_for(
        "the exporter alerts pending",
        Duration::from_secs(60),
        || {
            let s = alert_states(addr)?;
            expected
                .iter()
                .all(|(name, _)| s.get(*name).is_some_and(|(st, _)| st != "inactive"))
                .then_some(s)
        },
    );
    for (name, file) in expected {
        let (_, alerts) = &states[name];
        assert_eq!(alerts.len(), 1, "{name}: {alerts:?}");
        if let Some(f) = file {
            let label = alerts[0]["labels"]["file"].as_str().unwrap();
            assert!(
                label.ends_with(&format!("/{f}")) || label == f,
                "{name}: {label}"
            );
        }
    }
    // Fresh files, readable: these stay quiet.
    for name in [
        "SvcMetricsTextfileNotUpdated",
        "SvcBrokerMonitoringNotUpdated",
        "SvcMetricsTextfileUnreadable",
    ] {
        assert_eq!(states[name].0, "inactive", "{name}: {:?}", states[name]);
    }
}
