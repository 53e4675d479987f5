//! `contrib/prometheus/`: the rules pass `promtool check rules`, their unit tests pass
//! `promtool test rules` (every alert with a firing and a silent case), and every runner
//! metric they name is one the exporter really serves.

mod kit_util;

use std::collections::BTreeMap;
use std::process::Command;

use kit_util::*;

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
