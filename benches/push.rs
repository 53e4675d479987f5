//! Push-connector figures, printed (never asserted): for each connector, the whole export of a
//! realistic snapshot (every runner metric, 20 subject families shared under hashed labels,
//! everything allowed) to its real receiver, next to that receiver's own round trip measured
//! in the same run:
//! - OTLP (`otlp`, `search_stack`, `collector_agent`): the opentelemetry-proto decoding
//!   receiver; baseline = POST of an empty `ExportMetricsServiceRequest` (`{}`) to it;
//! - SIEM HEC: the strict local receiver; baseline = POST of a one-metric event;
//! - StatsD, agent StatsD: the npm daemon; syslog: rsyslogd (UDP); baseline = sending the same
//!   datagrams, pre-rendered, through a plain connected UDP socket.
//!
//! "export" is in-process (`run_with_policy`: read snapshot, filter, render, send, answer);
//! "CLI" is the wall time of one `svc-observe <command>` process, as a timer unit runs it.
//!
//! Run: `cargo bench --bench push` (needs the test tools: `SVC_TEST_VENV`, `SVC_TEST_STATSD`,
//! rsyslog). Without `--bench` (under `cargo test --all-targets`) it is a 3-run smoke pass.

#[path = "../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod net;
#[path = "../tests/support/observe.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod observe;
#[path = "../tests/support/push.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod push_util;
#[path = "../tests/support/python.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod python;
#[path = "../tests/support/temp.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod temp;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svc::observe::connectors::{self, run_with_policy, Connector, Delivery, ExportArgs, Outcome};
use svc::observe::policy::Policy;

fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

const TOKEN: &str = "bench-token-0123";

/// Mean seconds per call of `f` over `runs` calls (after one warm-up call).
fn time_per_op(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..runs {
        f();
    }
    t.elapsed().as_secs_f64() / runs as f64
}

fn export_once(c: &Connector, policy: &Policy, args: &ExportArgs) {
    let mut sink = Vec::new();
    match run_with_policy(c, policy, args, &mut sink) {
        Ok(Outcome::Sent(_)) => {}
        other => panic!("{}: {other:?}", c.command),
    }
}

/// Headers and body of one rendered request.
type Rendered = (Vec<(String, String)>, Vec<u8>);

/// What one export sends, rendered in-process (the same plan the export builds).
struct Payload {
    bytes: usize,
    items: usize,
    /// HTTP: `(headers, body)` of each request; datagrams: each datagram as `(.., bytes)`.
    requests: Vec<Rendered>,
    datagrams: Vec<Vec<u8>>,
}

/// Reads the snapshot, filters and renders, without sending.
fn build(c: &Connector, policy: &Policy, args: &ExportArgs) -> Payload {
    let connectors::Action::Plan(f) = c.action else {
        unreachable!()
    };
    let prepared =
        connectors::prepare(args.snapshot.as_ref().unwrap(), policy, c.block, None, true).unwrap();
    let ctx = connectors::Context {
        policy,
        prepared: Some(&prepared),
        dry_run: true,
        allow_stale: true,
        deadline: connectors::Deadline::start(c.block, 60.0),
    };
    let plan = f(&ctx).unwrap();
    match plan.delivery {
        Delivery::Http { requests, .. } => Payload {
            bytes: requests.iter().map(|r| r.body.len()).sum(),
            items: requests.len(),
            requests: requests
                .into_iter()
                .map(|r| {
                    let h = r
                        .headers
                        .iter()
                        .map(|h| (h.name.clone(), h.wire_value().to_string()))
                        .collect();
                    (h, r.body)
                })
                .collect(),
            datagrams: Vec::new(),
        },
        Delivery::Datagrams { datagrams, .. } => {
            let bytes: Vec<Vec<u8>> = datagrams.into_iter().map(|(_, d)| d).collect();
            Payload {
                bytes: bytes.iter().map(Vec::len).sum(),
                items: bytes.len(),
                requests: Vec::new(),
                datagrams: bytes,
            }
        }
    }
}

fn cli_wall(runs: usize, command: &str, args: &ExportArgs) -> f64 {
    time_per_op(runs, || {
        let st = Command::new(env!("CARGO_BIN_EXE_svc-observe"))
            .arg(command)
            .arg(args.snapshot.as_ref().unwrap())
            .arg(&args.policy)
            .arg("--allow-stale")
            .env("SVC_BENCH_HEC_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .unwrap();
        assert!(st.success(), "{command}");
    })
}

fn post(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut b = agent.post(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = b.send(body).unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
}

struct Row {
    export: f64,
    cli: f64,
    build: f64,
    same: f64,
    base: f64,
    bytes: usize,
    items: usize,
}

fn row(name: &str, r: &Row) {
    println!(
        "{name:<23} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>9.1}x {:>7} B in {:>3}",
        r.export * 1e3,
        r.cli * 1e3,
        r.build * 1e3,
        r.same * 1e3,
        r.base * 1e3,
        r.export / r.same,
        r.bytes,
        r.items
    );
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench push`"
        );
    }
    let runs = if full() { 200 } else { 3 };
    let cli_runs = if full() { 30 } else { 1 };
    let dir = temp::TempDir::new("push-bench");
    let fams: Vec<(String, String)> = (0..20)
        .map(|i| (format!("tenant{i}.orders.>"), format!("tenant{i}")))
        .collect();
    let fam_refs: Vec<(&str, &str)> = fams.iter().map(|(s, l)| (s.as_str(), l.as_str())).collect();
    let snap = dir.write("snap.json", &observe::snapshot(&fam_refs, 0.0));
    std::env::set_var("SVC_BENCH_HEC_TOKEN", TOKEN);

    let otlp = push_util::Receiver::start(&dir, "otlp_receiver.py", &[], &[]);
    let hec = push_util::Receiver::start(
        &dir,
        "hec_receiver.py",
        &["--token-env", "EXPECTED"],
        &[("EXPECTED", TOKEN)],
    );
    let statsd = push_util::Statsd::start(&dir);
    let rsyslog = push_util::Rsyslog::start(&dir);
    let otlp_url = format!("http://127.0.0.1:{}/v1/metrics", otlp.port);
    let hec_url = format!("http://127.0.0.1:{}/services/collector/event", hec.port);
    let blocks = format!(
        r#"{{"subject_metrics": {{"enabled": true, "rules": [{{"subject": ">", "label": "all", "display_mode": "hash"}}]}},
            "otlp": {{"enabled": true, "endpoint": "{otlp_url}"}},
            "search_stack": {{"enabled": true, "endpoint": "{otlp_url}"}},
            "collector_agent": {{"enabled": true, "endpoint": "{otlp_url}"}},
            "siem_hec": {{"enabled": true, "endpoint": "{hec_url}", "token_env": "SVC_BENCH_HEC_TOKEN"}},
            "statsd": {{"enabled": true, "port": {sp}}},
            "agent_statsd": {{"enabled": true, "port": {sp}, "tags": {{"env": "bench"}}, "include_metric_labels_as_tags": true}},
            "syslog": {{"enabled": true, "port": {yp}}}}}"#,
        sp = statsd.port,
        yp = rsyslog.port
    );
    let policy_path = dir.write("policy.json", &observe::policy(&blocks));
    let policy = Policy::load(&policy_path).unwrap();
    let args = ExportArgs {
        snapshot: Some(snap.clone()),
        policy: policy_path.clone(),
        dry_run: false,
        allow_stale: true,
    };

    println!(
        "push connectors: {} runs per figure ({}), snapshot with every runner metric and 20 families",
        runs,
        if full() { "full" } else { "smoke pass, not meaningful" }
    );
    println!("columns (ms per export): export = in-process run_with_policy (read, filter, render,");
    println!(
        "send, answer); CLI = one svc-observe process; build = read+filter+render only; same ="
    );
    println!(
        "the same payload sent by a plain client; base = the receiver's own minimal round trip"
    );
    println!(
        "(empty OTLP request / one-metric HEC event / one raw datagram); ratio = export / same."
    );
    println!(
        "{:<23} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>14}",
        "connector", "export", "CLI", "build", "same", "base", "ratio", "sent"
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let http_row = |c: &Connector, base: f64, url: &str| {
        let p = build(c, &policy, &args);
        let build_t = time_per_op(runs, || {
            build(c, &policy, &args);
        });
        // The baseline resends every request of the export's plan, not just the first.
        let same = time_per_op(runs, || {
            for (headers, body) in &p.requests {
                let h: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                post(&agent, url, &h, body);
            }
        });
        let export = time_per_op(runs, || export_once(c, &policy, &args));
        let cli = cli_wall(cli_runs, c.command, &args);
        Row {
            export,
            cli,
            build: build_t,
            same,
            base,
            bytes: p.bytes,
            items: p.items,
        }
    };

    // OTLP and its profiles against the decoding receiver.
    let base_otlp = time_per_op(runs, || {
        post(
            &agent,
            &otlp_url,
            &[("Content-Type", "application/json")],
            b"{}",
        )
    });
    for c in [
        &connectors::otlp::CONNECTOR,
        &connectors::search_stack::CONNECTOR,
        &connectors::collector_agent::CONNECTOR,
    ] {
        row(c.command, &http_row(c, base_otlp, &otlp_url));
    }

    // SIEM HEC against the strict receiver.
    let one = br#"{"time": 1718000000, "event": "metric", "host": "svc", "fields": {"metric_name:svc_x": 1}}"#;
    let auth = format!("Splunk {TOKEN}");
    let base_hec = time_per_op(runs, || {
        post(
            &agent,
            &hec_url,
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            one,
        )
    });
    let c = &connectors::siem_hec::CONNECTOR;
    row(c.command, &http_row(c, base_hec, &hec_url));

    // Datagram connectors: same = the same datagrams through a plain connected socket.
    for (c, port) in [
        (&connectors::statsd::CONNECTOR, statsd.port),
        (&connectors::agent_statsd::CONNECTOR, statsd.port),
        (&connectors::syslog::CONNECTOR, rsyslog.port),
    ] {
        let p = build(c, &policy, &args);
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(("127.0.0.1", port)).unwrap();
        let same = time_per_op(runs, || {
            for d in &p.datagrams {
                sock.send(d).unwrap();
            }
        });
        let base = time_per_op(runs, || {
            sock.send(&p.datagrams[0]).unwrap();
        });
        let build_t = time_per_op(runs, || {
            build(c, &policy, &args);
        });
        let export = time_per_op(runs, || export_once(c, &policy, &args));
        let cli = cli_wall(cli_runs, c.command, &args);
        row(
            c.command,
            &Row {
                export,
                cli,
                build: build_t,
                same,
                base,
                bytes: p.bytes,
                items: p.items,
            },
        );
    }
    println!(
        "statsd bad lines seen: {} (must be 0)",
        statsd.stat("messages.bad_lines_seen")
    );
}
