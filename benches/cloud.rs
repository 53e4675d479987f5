//! Cloud connector and broker monitoring figures, printed (never asserted), each next to a
//! baseline measured in the same run:
//! - `build`: one export's requests rendered and signed in-process (SigV4 for cloud B, RSA-2048
//!   for cloud A, none for cloud C), next to `sha256`: only hashing the same bodies, the part
//!   of any signature that grows with the body;
//! - `export`: the whole export in-process (read snapshot, filter, render, sign, send), next to
//!   `resend`: sending the same pre-built requests (bytes and headers) to the same receiver
//!   (moto for cloud B; the strict local receiver of the tests, answering 200, for A and C);
//! - `cli`: wall time of one `svc-observe <command>` process, as a timer unit runs it;
//! - broker: one `broker-monitoring-poll` poll in-process against a real nats-server, next to
//!   plain GETs of the same endpoints (no extraction).
//!
//! Snapshot: every runner metric, 20 subject families shared under hashed labels, everything
//! allowed, family rows as dimensions. Run: `cargo bench --bench cloud` (needs moto in
//! `SVC_TEST_VENV`, nats-server, openssl). Without `--bench` (under `cargo test --all-targets`)
//! it is a 3-run smoke pass.

#[path = "../tests/support/http.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod cloud_util;
#[path = "../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod net;
#[path = "../tests/support/observe.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod observe_util;
#[path = "../tests/support/temp.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod temp;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use svc::observe::connectors::{
    self, broker_monitoring, run_with_policy, Connector, Delivery, ExportArgs, Outcome,
};
use svc::observe::policy::Policy;

fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn time_per_op(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..runs {
        f();
    }
    t.elapsed().as_secs_f64() / runs as f64
}

/// Mean seconds per op of `f` and `g`, run alternately (`f`, `g`, `f`, `g`, ...): the receiver
/// grows with every request (moto keeps what it is sent), so neither side may have it all
/// fresh or all grown.
fn time_alternating(runs: usize, mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    f();
    g();
    let (mut tf, mut tg) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..runs {
        let t = Instant::now();
        f();
        tf += t.elapsed();
        let t = Instant::now();
        g();
        tg += t.elapsed();
    }
    (
        tf.as_secs_f64() / runs as f64,
        tg.as_secs_f64() / runs as f64,
    )
}

/// `(url, headers, body)` of each request of one export's plan.
type Built = Vec<(String, Vec<(String, String)>, Vec<u8>)>;

fn build(c: &Connector, policy: &Policy, args: &ExportArgs) -> Built {
    let connectors::Action::Plan(f) = c.action else {
        unreachable!()
    };
    let prepared =
        connectors::prepare(args.snapshot.as_ref().unwrap(), policy, c.block, None, true).unwrap();
    let ctx = connectors::Context {
        policy,
        prepared: Some(&prepared),
        dry_run: false,
        allow_stale: true,
        deadline: connectors::Deadline::start(c.block, 60.0),
    };
    let Delivery::Http { requests, .. } = f(&ctx).unwrap().delivery else {
        unreachable!()
    };
    requests
        .into_iter()
        .map(|r| {
            let h = r
                .headers
                .iter()
                .map(|h| (h.name.clone(), h.wire_value().to_string()))
                .collect();
            (r.url, h, r.body)
        })
        .collect()
}

fn resend(agent: &ureq::Agent, built: &Built) {
    for (url, headers, body) in built {
        let mut b = agent.post(url);
        for (k, v) in headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let resp = b.send(&body[..]).unwrap();
        assert!(resp.status().is_success(), "{url}: {}", resp.status());
    }
}

fn cli_wall(runs: usize, args: &[&str]) -> f64 {
    time_per_op(runs, || {
        let st = Command::new(env!("CARGO_BIN_EXE_svc-observe"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
    })
}

fn venv() -> PathBuf {
    std::env::var_os("SVC_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/svc-test-tools/venv")
        })
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench cloud`"
        );
    }
    let runs = if full() { 100 } else { 3 };
    let cli_runs = if full() { 20 } else { 1 };
    let dir = temp::TempDir::new("cloud-bench");
    let fams: Vec<(String, String)> = (0..20)
        .map(|i| (format!("tenant{i}.orders.>"), format!("tenant{i}")))
        .collect();
    let fam_refs: Vec<(&str, &str)> = fams.iter().map(|(s, l)| (s.as_str(), l.as_str())).collect();
    let snap = dir.write("snap.json", &observe_util::snapshot(&fam_refs, 0.0));

    // Receivers: moto (signatures not enforced: the bench measures throughput) and the
    // strict local receiver of the tests answering 200.
    let moto_port = net::free_port();
    let _moto = observe_util::ChildGuard(
        Command::new(venv().join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &moto_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server of the test venv"),
    );
    observe_util::wait_for("moto", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", moto_port)).ok()
    });
    let rx = cloud_util::Receiver::start(Box::new(|_| {
        (
            200,
            r#"{"failedMetricsCount": 0, "failedMetrics": []}"#.into(),
        )
    }));
    let key = dir.join("api.pem");
    assert!(Command::new("openssl")
        .args(["genrsa", "-out", key.to_str().unwrap(), "2048"])
        .output()
        .unwrap()
        .status
        .success());
    let oci_config = dir.write(
        "oci-config",
        &format!(
            "[DEFAULT]\nuser=ocid1.user.oc1..bench\nfingerprint=20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\ntenancy=ocid1.tenancy.oc1..bench\nkey_file={}\n",
            key.display()
        ),
    );
    std::env::set_var("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE");
    std::env::set_var(
        "AWS_SECRET_ACCESS_KEY",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    );
    std::env::set_var(
        "AWS_ENDPOINT_URL_CLOUDWATCH",
        format!("http://127.0.0.1:{moto_port}"),
    );
    std::env::set_var("SVC_CLOUD_A_ENDPOINT_OVERRIDE", rx.url());
    std::env::set_var("SVC_CLOUD_C_ENDPOINT_OVERRIDE", rx.url());
    std::env::set_var("SVC_BENCH_AZ_TOKEN", "bench-token");

    let blocks = format!(
        r#"{{"subject_metrics": {{"enabled": true, "rules": [{{"subject": ">", "label": "all", "display_mode": "hash"}}]}},
            "cloud_a_monitoring": {{"enabled": true, "region": "eu-frankfurt-1", "compartment_id": "ocid1.compartment.oc1..bench",
                "auth_mode": "config_file", "config_file": "{}", "max_metrics_per_request": 50,
                "include_metric_labels_as_dimensions": true}},
            "cloud_b_monitoring": {{"enabled": true, "region": "us-east-1", "max_metrics_per_request": 1000,
                "include_metric_labels_as_dimensions": true}},
            "cloud_c_monitoring": {{"enabled": true, "resource_id": "/subscriptions/s/resourceGroups/g/providers/p/x",
                "location": "westeurope", "token_env": "SVC_BENCH_AZ_TOKEN", "include_metric_labels_as_dimensions": true}}}}"#,
        oci_config.display()
    );
    let policy_path = dir.write("policy.json", &observe_util::policy(&blocks));
    let policy = Policy::load(&policy_path).unwrap();
    let args = ExportArgs {
        snapshot: Some(snap.clone()),
        policy: policy_path.clone(),
        dry_run: false,
        allow_stale: true,
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();

    println!("cloud connectors, {runs} runs each (ms per export; ratios against the baseline of the same run)");
    println!(
        "{:<16} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>8} {:>10} {:>5}",
        "command", "build", "sha256", "ratio", "export", "resend", "ratio", "cli", "bytes", "reqs"
    );
    for c in connectors::CONNECTORS
        .iter()
        .filter(|c| c.command.starts_with("cloud-"))
    {
        let built = build(c, &policy, &args);
        let bytes: usize = built.iter().map(|(_, _, b)| b.len()).sum();
        let t_build = time_per_op(runs, || {
            std::hint::black_box(build(c, &policy, &args));
        });
        let t_hash = time_per_op(runs, || {
            for (_, _, b) in &built {
                std::hint::black_box(Sha256::digest(b));
            }
        });
        let (t_export, t_resend) = time_alternating(
            runs,
            || {
                let mut sink = Vec::new();
                match run_with_policy(c, &policy, &args, &mut sink) {
                    Ok(Outcome::Sent(_)) => {}
                    other => panic!("{}: {other:?}", c.command),
                }
            },
            || resend(&agent, &built),
        );
        let snap_s = snap.to_str().unwrap();
        let pol_s = policy_path.to_str().unwrap();
        let t_cli = cli_wall(cli_runs, &[c.command, snap_s, pol_s, "--allow-stale"]);
        println!(
            "{:<16} {:>8.3} {:>8.3} {:>6.1}x {:>8.3} {:>8.3} {:>6.2}x {:>8.2} {:>10} {:>5}",
            c.command,
            t_build * 1e3,
            t_hash * 1e3,
            t_build / t_hash,
            t_export * 1e3,
            t_resend * 1e3,
            t_export / t_resend,
            t_cli * 1e3,
            bytes,
            built.len()
        );
    }

    // Broker monitoring against a real nats-server.
    let mon = net::free_port();
    let store = temp::TempDir::new("cloud-bench-nats");
    let _nats = observe_util::ChildGuard(
        Command::new("/usr/sbin/nats-server")
            .args(["-a", "127.0.0.1", "-p", &net::free_port().to_string()])
            .args(["-m", &mon.to_string(), "-js", "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server"),
    );
    observe_util::wait_for("nats-server", Duration::from_secs(10), || {
        observe_util::get10(([127, 0, 0, 1], mon).into(), "/healthz").filter(|(s, _)| *s == 200)
    });
    let bpol = Policy::parse(
        &serde_json::json!({"schema": "svc.observability.policy.v1", "enabled": true,
            "broker_server_monitoring": {"enabled": true, "scrape_enabled": true,
            "base_url": format!("http://127.0.0.1:{mon}"),
            "allowed_endpoints": ["/varz", "/jsz", "/healthz"],
            "allowed_fields": ["mem", "cpu", "connections", "in_msgs", "out_msgs", "in_bytes",
                "out_bytes", "slow_consumers", "subscriptions", "jetstream.stats.memory",
                "jetstream.stats.storage", "messages", "bytes", "streams", "consumers", "status"]}})
        .to_string(),
    )
    .unwrap();
    let cfg = &bpol.broker_server_monitoring;
    let t_poll = time_per_op(runs, || {
        std::hint::black_box(broker_monitoring::poll(cfg).unwrap());
    });
    // A fresh client per poll on both sides (each poll is a process of its own).
    let t_get = time_per_op(runs, || {
        let plain: ureq::Agent = ureq::Agent::config_builder().build().into();
        for e in &cfg.allowed_endpoints {
            let mut r = plain
                .get(format!("http://127.0.0.1:{mon}{e}"))
                .call()
                .unwrap();
            std::hint::black_box(r.body_mut().read_to_vec().unwrap());
        }
    });
    let bpath = dir.write("broker.json", &bpol.to_json_pretty());
    let prom = dir.join("svc-broker.prom");
    let t_cli = cli_wall(
        cli_runs,
        &[
            "broker-monitoring-poll",
            bpath.to_str().unwrap(),
            "--output",
            prom.to_str().unwrap(),
        ],
    );
    println!();
    println!(
        "broker-monitoring-poll (3 endpoints, 16 fields): poll {:.3} ms, plain GETs with a fresh client {:.3} ms, ratio {:.2}x; cli {:.2} ms",
        t_poll * 1e3,
        t_get * 1e3,
        t_poll / t_get,
        t_cli * 1e3
    );
}
