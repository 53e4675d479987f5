//! The units in `contrib/systemd/`: `systemd-analyze verify` accepts them and
//! `systemd-analyze security --offline=true` rates every service at an exposure of 2.0 or
//! lower, the exporters narrower than the runner.

use std::path::{Path, PathBuf};
use std::process::Command;

const SERVICES: &[&str] = &[
    "svc.service",
    "svc-observe-textfile.service",
    "svc-observe-http.service",
];
const UNITS: &[&str] = &[
    "svc.service",
    "svc-observe-textfile.service",
    "svc-observe-http.service",
    "svc-observe-textfile.timer",
];

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd")
}

fn unit_text(name: &str) -> String {
    std::fs::read_to_string(contrib().join(name)).unwrap()
}

/// Copies the units into a temporary directory with `ExecStart` pointing at the binaries
/// built by this test run (verify checks that the command exists).
fn staged() -> PathBuf {
    // The process id alone is not unique: every test of the suite shares the process.
    let dir = tempfile::Builder::new()
        .prefix("svc-units-")
        .tempdir()
        .unwrap()
        .keep();
    for u in UNITS {
        let text = unit_text(u)
            .replace(
                "/usr/bin/svc-observe ",
                &format!("{} ", env!("CARGO_BIN_EXE_svc-observe")),
            )
            .replace("/usr/bin/svc ", &format!("{} ", env!("CARGO_BIN_EXE_svc")));
        std::fs::write(dir.join(u), text).unwrap();
    }
    dir
}

#[test]
fn systemd_analyze_verify_accepts_every_unit() {
    let dir = staged();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .args(UNITS.iter().map(|u| dir.join(u)))
        .output()
        .expect("systemd-analyze is installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verify failed:\n{stderr}");
    assert!(stderr.trim().is_empty(), "verify warnings:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn exposure(unit: &Path) -> f64 {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=20"])
        .arg(unit)
        .output()
        .expect("systemd-analyze is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} exposure over 2.0:\n{text}{}",
        unit.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no overall exposure in:\n{text}"));
    line.split(": ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"))
}

#[test]
fn every_service_is_hardened_to_exposure_2_or_lower() {
    let scores: Vec<f64> = SERVICES
        .iter()
        .map(|s| exposure(&contrib().join(s)))
        .collect();
    for (s, score) in SERVICES.iter().zip(&scores) {
        assert!(*score <= 2.0, "{s}: {score}");
    }
    // The exporters are narrower than the runner.
    assert!(scores[1] < scores[0] && scores[2] < scores[0], "{scores:?}");
}

#[test]
fn units_have_the_documented_shape() {
    let timer = unit_text("svc-observe-textfile.timer");
    for line in [
        "OnBootSec=30s",
        "OnUnitActiveSec=15s",
        "AccuracySec=5s",
        "Persistent=true",
        "Unit=svc-observe-textfile.service",
    ] {
        assert!(timer.lines().any(|l| l == line), "timer lacks {line}");
    }
    let oneshot = unit_text("svc-observe-textfile.service");
    assert!(oneshot.lines().any(|l| l == "Type=oneshot"));
    assert!(oneshot.lines().any(|l| l == "PrivateNetwork=yes"));
    assert!(oneshot
        .lines()
        .any(|l| l == "ReadWritePaths=/var/lib/prometheus/node-exporter"));
    let http = unit_text("svc-observe-http.service");
    assert!(
        !http.lines().any(|l| l.trim() == "[Install]"),
        "the HTTP endpoint is disabled by default"
    );
    assert!(
        !http.contains("ReadWritePaths"),
        "the HTTP endpoint writes nothing"
    );
    let runner = unit_text("svc.service");
    assert!(runner
        .lines()
        .any(|l| l == "ExecStart=/usr/bin/svc run /etc/svc/config.json"));
    for unit in SERVICES {
        let text = unit_text(unit);
        for line in [
            "NoNewPrivileges=yes",
            "CapabilityBoundingSet=",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
        ] {
            assert!(text.lines().any(|l| l == line), "{unit} lacks {line}");
        }
        assert!(
            text.lines().any(|l| l.starts_with("User=")),
            "{unit} runs as its own user"
        );
        assert!(text
            .lines()
            .any(|l| l.starts_with("RestrictAddressFamilies=")));
        assert!(text.lines().any(|l| l.starts_with("SystemCallFilter=")));
    }
}

/// The exporter units' command lines run as written, with their paths moved into a scratch
/// directory: a missing or extra argument fails here (an appended `--help` would return
/// before the argument checks). A disabled policy needs no snapshot: the textfile unit writes
/// its one comment line to the unit's `--output`, and the HTTP unit exits without listening.
#[test]
fn exporter_command_lines_run() {
    let scratch = tempfile::Builder::new()
        .prefix("svc-unit-cmd-")
        .tempdir()
        .unwrap();
    let root = scratch.path();
    for d in ["etc/svc", "var/lib/svc", "var/lib/prometheus/node-exporter"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(
        root.join("etc/svc/observability-policy.json"),
        r#"{"schema": "svc.observability.policy.v1"}"#,
    )
    .unwrap();
    let moved = |arg: &str| match arg.strip_prefix('/') {
        Some(rest) => root.join(rest).display().to_string(),
        None => arg.to_string(),
    };
    for unit in ["svc-observe-textfile.service", "svc-observe-http.service"] {
        let text = unit_text(unit);
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=/usr/bin/svc-observe "))
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_svc-observe"))
            .args(exec.split_whitespace().map(moved))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{unit}: {stderr}");
        if unit == "svc-observe-http.service" {
            assert!(stderr.contains("disabled by policy"), "{unit}: {stderr}");
        }
    }
    let prom = root.join("var/lib/prometheus/node-exporter/svc.prom");
    assert_eq!(
        std::fs::read_to_string(&prom).unwrap(),
        "# svc-observe: metrics export is disabled by policy (enabled=false)\n"
    );
}
