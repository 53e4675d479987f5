//! `contrib/grafana/svc-dashboard.json` against the real chain: `svc run` (real nats-server)
//! writes the snapshot, `svc-observe scrape-http` serves it, a real Prometheus scrapes it
//! every second with `contrib/prometheus/svc-rules.yml` loaded. Every panel query of the
//! dashboard, with the dashboard variables substituted, must return data through
//! Prometheus's HTTP API: no panel is empty because a metric name or label is wrong.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::broker::NatsServer;
use crate::support::observe::{get10, policy, start_http, urlencode, wait_for, ChildGuard};
use crate::support::process::Runner;
use crate::support::write_config;
use serde_json::{json, Value};

fn dashboard() -> Value {
    let text = std::fs::read_to_string(crate::support::kit::repo(
        "contrib/grafana/svc-dashboard.json",
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every (panel title, expr) of the dashboard, rows' nested panels included.
fn panel_queries(d: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push((
                    p["title"].as_str().unwrap_or_default().to_string(),
                    t["expr"].as_str().unwrap().to_string(),
                ));
            }
            if let Some(inner) = p["panels"].as_array() {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(d["panels"].as_array().unwrap(), &mut out);
    out
}

/// The values Grafana would put in: the test's job, every instance, a one-minute window.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", "svc")
        .replace("$instance", ".+")
}

/// Instant query: the result vector (empty when the query fails).
fn query(addr: SocketAddr, promql: &str) -> Vec<Value> {
    let Some((200, body)) = get10(addr, &format!("/api/v1/query?query={}", urlencode(promql)))
    else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{promql}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

#[test]
fn dashboard_is_provisionable_and_names_real_metrics() {
    let d = dashboard();
    assert_eq!(d["uid"], "svc-overview");
    assert!(d["id"].is_null(), "file provisioning assigns the id");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance"]);
    // Every panel and target reads the data source variable, never a fixed UID.
    let mut ids = std::collections::BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id");
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["datasource"]["uid"], "${datasource}");
            }
        }
    }
    let served = crate::support::kit::exported_names();
    let queries = panel_queries(&d);
    assert!(queries.len() >= 30, "{}", queries.len());
    for (title, expr) in &queries {
        for name in crate::support::kit::svc_names(expr) {
            assert!(served.contains(&name), "{title}: {name} is not served");
        }
    }
    // The sections the issue asks for.
    let titles: Vec<&str> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        titles,
        [
            "Throughput",
            "Acknowledgement progress",
            "Event age",
            "Failures and dead letters",
            "Sink batches",
            "Fan-out children",
            "Exporter and broker connection",
            "Governance and spool"
        ]
    );
    // The provisioning example points Grafana at a folder of dashboards.
    let prov = std::fs::read_to_string(crate::support::kit::repo(
        "contrib/grafana/svc-dashboards.yaml",
    ))
    .unwrap();
    assert!(prov.contains("type: file") && prov.contains("path: /var/lib/grafana/dashboards/svc"));
}

#[test]
fn every_panel_query_returns_data_from_a_real_prometheus() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc",
                     "subject": "orders.>"},
            "delivery": {"batch_size": 16, "fetch_expiry_ms": 200},
            "sink": {"type": "file", "directory": dir.path().join("out")},
            "metrics": {"enabled": true, "snapshot_file": snap, "write_interval_seconds": 1,
                        "subject_families": [{"subject": "orders.>", "label": "orders"}]}
        }),
    );
    let _runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    server.publish_n("ORDERS", "orders.created", 20, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    crate::support::wait_until(Duration::from_secs(30), "the first snapshot", || {
        crate::support::snapshot_counter(&snap, "messages_acked_total") >= 20
    });

    let port = crate::support::free_port();
    let mut p: Value = serde_json::from_str(&policy(
        r#"{"subject_metrics": {"enabled": true, "rules": [{"subject": "orders.>", "label": "orders"}]}}"#,
    ))
    .unwrap();
    p["scrape"]["http_endpoint"]["port"] = port.into();
    let pol = dir.path().join("policy.json");
    std::fs::write(&pol, p.to_string()).unwrap();
    let _observe = start_http(&snap, &pol, &[], port);

    let prom_port = crate::support::free_port();
    let conf = dir.path().join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: svc\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
            crate::support::kit::repo("contrib/prometheus/svc-rules.yml").display()
        ),
    )
    .unwrap();
    let _prom = ChildGuard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed (Debian package prometheus)"),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], prom_port));
    wait_for("the first scrapes", Duration::from_secs(60), || {
        let r = query(addr, "count_over_time(up{job=\"svc\"}[1m]) >= 2");
        (!r.is_empty()).then_some(())
    });
    // Traffic while Prometheus watches, so rates and per-batch means have something to show.
    server.publish_n("ORDERS", "orders.created", 30, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    wait_for(
        "the second batch acked and scraped",
        Duration::from_secs(60),
        || {
            let r = query(
                addr,
                "svc_messages_acked_total{job=\"svc\",subject_family=\"\"} >= 50",
            );
            (!r.is_empty()).then_some(())
        },
    );
    // Two more scrapes after the last change.
    wait_for("two more scrapes", Duration::from_secs(30), || {
        let r = query(
            addr,
            "count_over_time((svc_messages_acked_total{job=\"svc\",subject_family=\"\"} >= 50)[1m:1s]) >= 2",
        );
        (!r.is_empty()).then_some(())
    });

    let mut empty = Vec::new();
    let queries = panel_queries(&dashboard());
    for (title, expr) in &queries {
        let promql = substitute(expr);
        assert!(!promql.contains('$'), "unsubstituted variable in {promql}");
        if query(addr, &promql).is_empty() {
            empty.push(format!("{title}: {promql}"));
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );

    // Values, not just series: messages flowed during the window.
    let fetched = query(
        addr,
        &substitute(
            "rate(svc_messages_fetched_total{job=~\"$job\", subject_family=\"\"}[$__rate_interval])",
        ),
    );
    let v: f64 = fetched[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(v > 0.0, "{fetched:?}");

    // The alert rules are loaded by the same Prometheus.
    let (status, body) = get10(addr, "/api/v1/rules").unwrap();
    assert_eq!(status, 200);
    let rules: Value = serde_json::from_str(&body).unwrap();
    let mut groups: Vec<&str> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    groups.sort();
    assert_eq!(groups, ["svc.exporter", "svc.recording", "svc.runner"]);
}
