//! Exporter figures, printed (never asserted):
//! 1. CPU time of one `svc-observe scrape-textfile` run over a realistic snapshot (every
//!    runner metric, 20 subject families, all shared), next to a `cp` of the same snapshot as
//!    the floor cost of a process that reads and writes one file; plus the in-process render.
//! 2. Requests per second of `svc-observe scrape-http` next to the node exporter serving the
//!    same metrics from its textfile collector, both measured with wrk in this run.
//!
//! Run: `cargo bench --bench observe` (needs wrk and prometheus-node-exporter). Without the
//! `--bench` flag that `cargo bench` passes (i.e. under `cargo test --all-targets`) it runs a
//! short smoke pass: 3 runs and 1 s of wrk, figures not meaningful.

#[path = "../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod net;
use net::free_port;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use svc::message::subject::SubjectPattern;
use svc::metrics::snapshot::{self, Snapshot};
use svc::metrics::{Metrics, SubjectFamily};
use svc::observe::policy::Policy;

const FAMILIES: usize = 20;

/// Full measurement under `cargo bench`, a short smoke pass otherwise.
fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Children's user+system CPU seconds so far (`/proc/self/stat` cutime + cstime).
fn children_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 16 and 17 of stat(5); `after` starts at field 3.
    let ticks: f64 = f[13].parse::<f64>().unwrap() + f[14].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn realistic_snapshot() -> String {
    let families: Vec<SubjectFamily> = (0..FAMILIES)
        .map(|i| SubjectFamily {
            pattern: SubjectPattern::parse(&format!("tenant{i}.orders.>")).unwrap(),
            label: format!("tenant{i}"),
        })
        .collect();
    let m = Metrics::new(families);
    for n in svc::metrics::SummaryMetric::ALL {
        for v in 0..1000 {
            m.observe(n, f64::from(v) / 1000.0);
        }
    }
    for i in 0..FAMILIES {
        for metric in svc::metrics::FamilyMetric::ALL {
            m.add_family(
                m.family_of(&format!("tenant{i}.orders.x")),
                metric,
                1000 + i as u64,
            );
        }
    }
    let mut snap = snapshot::capture(&m, "svc", 1.0);
    for (i, v) in snap.counters.values_mut().enumerate() {
        *v = 1_000_000 + i as u64 * 7919;
    }
    serde_json::to_string_pretty(&snap).unwrap()
}

fn policy(out: &Path, port: u16) -> String {
    let rules: Vec<String> = (0..FAMILIES)
        .map(|i| format!(r#"{{"subject": "tenant{i}.>", "label": "tenant{i}"}}"#))
        .collect();
    format!(
        r#"{{"schema": "svc.observability.policy.v1", "enabled": true,
            "allowed_metric_patterns": ["*"], "include_observations": true, "include_legacy": true,
            "subject_metrics": {{"enabled": true, "rules": [{}]}},
            "scrape": {{"enabled": true, "output_file": "{}",
                        "http_endpoint": {{"enabled": true, "port": {port}}}}}}}"#,
        rules.join(", "),
        out.display()
    )
}

fn wrk(url: &str) -> f64 {
    let out = Command::new("wrk")
        .args(["-t2", "-c16", if full() { "-d5s" } else { "-d1s" }, url])
        .output()
        .expect("wrk is installed (Debian package wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Non-2xx"), "wrk saw errors:\n{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in:\n{text}"))
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench observe`"
        );
    }
    let runs: usize = if full() { 200 } else { 3 };
    let dir = std::env::temp_dir().join(format!("svc-observe-bench-{}", std::process::id()));
    let textdir = dir.join("textfile");
    std::fs::create_dir_all(&textdir).unwrap();
    let snapshot = dir.join("snap.json");
    std::fs::write(&snapshot, realistic_snapshot()).unwrap();
    let out: PathBuf = textdir.join("svc.prom");
    let port = free_port();
    let policy_path = dir.join("policy.json");
    std::fs::write(&policy_path, policy(&out, port)).unwrap();
    let bin = env!("CARGO_BIN_EXE_svc-observe");

    // 1. One scrape-textfile run, CPU time.
    let status = Command::new(bin)
        .arg("scrape-textfile")
        .args([&snapshot, &policy_path])
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::metadata(&out).unwrap().len();
    let lines = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    let before = children_cpu_seconds();
    let t = Instant::now();
    for _ in 0..runs {
        let s = Command::new(bin)
            .arg("scrape-textfile")
            .args([&snapshot, &policy_path])
            .status()
            .unwrap();
        assert!(s.success());
    }
    let wall = t.elapsed().as_secs_f64() / runs as f64;
    let ours = (children_cpu_seconds() - before) / runs as f64;
    let copy_to = dir.join("copy.prom");
    let before = children_cpu_seconds();
    for _ in 0..runs {
        assert!(Command::new("cp")
            .arg(&snapshot)
            .arg(&copy_to)
            .status()
            .unwrap()
            .success());
    }
    let cp = (children_cpu_seconds() - before) / runs as f64;

    let policy = Policy::load(&policy_path).unwrap();
    let text = std::fs::read_to_string(&snapshot).unwrap();
    let n = if full() { 2000 } else { 10 };
    let t = Instant::now();
    let mut total = 0;
    for _ in 0..n {
        let snap = Snapshot::parse(&text).unwrap();
        let sel = svc::observe::select::select(&snap, &policy).unwrap();
        total += svc::observe::exposition::render(
            &sel,
            &svc::observe::exposition::Options {
                namespace: "svc",
                include_help: true,
                include_type: true,
            },
        )
        .len();
    }
    let in_process = t.elapsed().as_secs_f64() / n as f64;
    assert!(total > 0);

    println!(
        "scrape-textfile over a snapshot with every runner metric and {FAMILIES} subject families"
    );
    println!("  output: {bytes} bytes, {lines} samples");
    println!("  svc-observe scrape-textfile: {:.2} ms CPU per run (user+sys, mean of {runs} runs; wall {:.2} ms)", ours * 1e3, wall * 1e3);
    println!(
        "  baseline `cp` of the snapshot: {:.2} ms CPU per run",
        cp * 1e3
    );
    println!("  ratio svc-observe / cp: {:.2}", ours / cp.max(1e-9));
    println!(
        "  in-process parse + select + render: {:.1} us",
        in_process * 1e6
    );

    // 2. HTTP requests per second, next to the node exporter serving the same file.
    let _observe = Guard(
        Command::new(bin)
            .arg("scrape-http")
            .args([&snapshot, &policy_path])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(port);
    let node_port = free_port();
    let _node = Guard(
        Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{node_port}"))
            .args([
                "--collector.disable-defaults",
                "--collector.textfile",
                "--web.disable-exporter-metrics",
            ])
            .arg(format!(
                "--collector.textfile.directory={}",
                textdir.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-node-exporter is installed"),
    );
    wait_port(node_port);
    let ours = wrk(&format!("http://127.0.0.1:{port}/metrics"));
    let node = wrk(&format!("http://127.0.0.1:{node_port}/metrics"));
    println!(
        "scrape-http vs node exporter textfile collector, same metrics (wrk -t2 -c16 -d{}s, keep-alive)",
        if full() { 5 } else { 1 }
    );
    println!("  svc-observe scrape-http: {ours:.0} requests/s");
    println!("  node exporter:           {node:.0} requests/s");
    println!("  ratio svc-observe / node exporter: {:.2}", ours / node);
    let _ = std::fs::remove_dir_all(&dir);
}
