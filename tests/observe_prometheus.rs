//! The real consumers: the node exporter's textfile collector serving our file, and a
//! Prometheus server scraping `svc-observe scrape-http`, queried through its HTTP API.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::observe::*;
use crate::support::{free_port, TempDir};

const FAMS: &[(&str, &str)] = &[("orders.>", "orders_all"), ("payments.*", "payments")];
const SUBJECT_RULES: &str = r#"{"subject_metrics": {"enabled": true, "rules": [
    {"subject": "orders.>", "label": "orders"}, {"subject": "payments.>", "label": "payments"}]}}"#;

#[test]
fn node_exporter_textfile_collector_serves_our_file() {
    let dir = TempDir::new("node");
    let textdir = dir.join("textfile");
    std::fs::create_dir_all(&textdir).unwrap();
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let p = dir.write("policy.json", &policy(SUBJECT_RULES));
    let out = textdir.join("svc.prom");
    let o = observe(&[&"scrape-textfile", &snap, &p, &"--output", &out]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ours = std::fs::read_to_string(&out).unwrap();
    assert_promtool_clean(&ours);

    let port = free_port();
    let _node = ChildGuard(
        Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
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
            .expect(
                "prometheus-node-exporter is installed (Debian package prometheus-node-exporter)",
            ),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let body = wait_for("node exporter metrics", Duration::from_secs(20), || {
        get10(addr, "/metrics")
            .filter(|(s, b)| *s == 200 && b.contains("svc_"))
            .map(|(_, b)| b)
    });
    assert!(body.contains("node_textfile_scrape_error 0"), "{body}");
    // Every sample of our file is served with the same value (Go may reformat numbers).
    let samples = |text: &str| -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap();
                // The collector gives every sample of a family the same label names; an empty
                // value means "no label" in Prometheus.
                let series = series.replace("{subject_family=\"\"}", "");
                (series, value.parse::<f64>().unwrap())
            })
            .collect()
    };
    let served = samples(&body);
    for (series, value) in samples(&ours) {
        assert!(
            served.iter().any(|(s, v)| *s == series && *v == value),
            "node exporter lacks {series} {value}"
        );
    }
    assert!(body.contains(&format!(
        "svc_messages_acked_total{{subject_family=\"\"}} {}\n",
        counter_value("messages_acked_total")
    )));
    assert!(body.contains("svc_messages_written_total{subject_family=\"orders\"} 10"));
    assert!(body.contains("svc_sink_batch_write_seconds_max 2"));

    // A disabled policy leaves a comment-only file: the collector serves no svc_ metric and
    // reports no error.
    let off = dir.write("off.json", r#"{"schema": "svc.observability.policy.v1"}"#);
    let o = observe(&[&"scrape-textfile", &snap, &off, &"--output", &out]);
    assert_eq!(o.status.code(), Some(0));
    let body = wait_for(
        "the disabled file to be served",
        Duration::from_secs(20),
        || {
            get10(addr, "/metrics")
                .filter(|(_, b)| !b.contains("svc_"))
                .map(|(_, b)| b)
        },
    );
    assert!(body.contains("node_textfile_scrape_error 0"), "{body}");
}

/// Runs an instant query and returns the values of the result vector as strings.
fn query(addr: SocketAddr, promql: &str) -> Option<Vec<String>> {
    let (status, body) = get10(addr, &format!("/api/v1/query?query={}", urlencode(promql)))?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.is_empty() {
        return None;
    }
    Some(
        result
            .iter()
            .map(|r| r["value"][1].as_str().unwrap_or_default().to_string())
            .collect(),
    )
}

#[test]
fn prometheus_scrapes_the_http_endpoint() {
    let dir = TempDir::new("prom");
    let port = free_port();
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let mut v: serde_json::Value = serde_json::from_str(&policy(SUBJECT_RULES)).unwrap();
    v["scrape"]["http_endpoint"]["port"] = port.into();
    v["scrape"]["stale_after_seconds"] = serde_json::Value::Null;
    let p = dir.write("policy.json", &v.to_string());
    let _observe = start_http(&snap, &p, &[], port);

    let prom_port = free_port();
    let conf = dir.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: svc\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
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
            .expect("prometheus is installed (Debian package prometheus)"),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], prom_port));
    let acked = wait_for("the first scrape", Duration::from_secs(60), || {
        query(addr, "svc_messages_acked_total{subject_family=\"\"}")
    });
    assert_eq!(acked, [counter_value("messages_acked_total").to_string()]);
    assert_eq!(query(addr, "up{job=\"svc\"}").unwrap(), ["1"]);
    assert_eq!(
        query(
            addr,
            "svc_messages_written_total{subject_family=\"payments\"}"
        )
        .unwrap(),
        ["20"]
    );
    assert_eq!(
        query(addr, "svc_sink_batch_write_seconds_count").unwrap(),
        ["3"]
    );
    assert_eq!(
        query(addr, "svc_sink_batch_write_seconds_min").unwrap(),
        ["0.25"]
    );
    assert_eq!(
        query(addr, "svc_last_sink_success_epoch_seconds").unwrap(),
        ["1700000000"]
    );
    // Only the reviewed family label reached Prometheus.
    let labels = query(
        addr,
        "count by (subject_family) (svc_messages_written_total{subject_family!=\"\"})",
    )
    .unwrap();
    assert_eq!(labels.len(), 2);
    // The scrape was clean: Prometheus ingested exactly as many samples as the endpoint
    // served (a sample it could not parse or had to drop would make these differ).
    let (status, served) =
        get10(SocketAddr::from(([127, 0, 0, 1], port)), "/metrics").expect("the endpoint answers");
    assert_eq!(status, 200);
    let served_samples = served
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert!(served_samples > 20, "{served}");
    let scraped = query(addr, "scrape_samples_scraped{job=\"svc\"}").unwrap();
    let ingested = query(addr, "scrape_samples_post_metric_relabeling{job=\"svc\"}").unwrap();
    assert_eq!(scraped, [served_samples.to_string()]);
    assert_eq!(ingested, [served_samples.to_string()]);
}
