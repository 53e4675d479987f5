//! `cloud-b-export` against moto's CloudWatch with signature checking enforced
//! (`INITIAL_NO_AUTH_ACTION_COUNT=3`, then three IAM calls make a user and its keys): the data
//! are read back with boto3 `get_metric_statistics` / `list_metrics`; a wrong secret gets
//! `SignatureDoesNotMatch`; credentials and the region never appear in any output.
//!
//! Needs the Python venv of `scripts/deps.sh` (`$SVC_TEST_VENV`, default
//! `~/.cache/svc-test-tools/venv`, with `moto[server]` and `boto3`).

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::observe::*;
use crate::support::{free_port, TempDir};
use serde_json::{json, Value};

/// True when the server on `port` is moto (its `/moto-api/` page answers 200).
fn is_moto(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

fn venv() -> PathBuf {
    match std::env::var_os("SVC_TEST_VENV") {
        Some(v) => PathBuf::from(v),
        None => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/svc-test-tools/venv"),
    }
}

fn helper() -> PathBuf {
    crate::support::python::script("receivers/moto_cloudwatch.py")
}

/// A moto server enforcing signatures, and the keys of the user made for the test.
struct Moto {
    _child: ChildGuard,
    url: String,
    key: String,
    secret: String,
}

impl Moto {
    fn start() -> Moto {
        // A free port can be taken by a parallel test between our pick and moto's bind, and a
        // bare TCP probe would then reach that other server: wait for moto's own API page,
        // and pick a new port when moto exits instead.
        let (child, port) = (0..5)
            .find_map(|_| {
                let port = free_port();
                let mut child = ChildGuard(
                    Command::new(venv().join("bin/moto_server"))
                        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                        .env("INITIAL_NO_AUTH_ACTION_COUNT", "3")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("moto_server from the test venv (scripts/deps.sh)"),
                );
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while std::time::Instant::now() < deadline {
                    if child.0.try_wait().unwrap().is_some() {
                        return None;
                    }
                    if is_moto(port) {
                        return Some((child, port));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                None
            })
            .expect("moto_server did not start on any of 5 ports");
        let url = format!("http://127.0.0.1:{port}");
        let out = Command::new(venv().join("bin/python"))
            .arg(helper())
            .args(["keys", &url])
            .output()
            .unwrap();
        assert!(out.status.success(), "IAM setup: {}", stderr(&out));
        let text = stdout(&out);
        let mut lines = text.lines();
        let key = lines.next().unwrap().to_string();
        let secret = lines.next().unwrap().to_string();
        Moto {
            _child: child,
            url,
            key,
            secret,
        }
    }

    /// `get_metric_statistics` for each `(name, dimensions)` (exact datapoint lists), then
    /// `list_metrics` of the namespace.
    fn stats(&self, namespace: &str, queries: &[(&str, Value)]) -> (Vec<Value>, Value) {
        let q: Vec<Value> = queries
            .iter()
            .map(|(n, d)| json!({"name": n, "dimensions": d}))
            .collect();
        let out = Command::new(venv().join("bin/python"))
            .arg(helper())
            .args([
                "stats",
                &self.url,
                "us-east-1",
                &self.key,
                &self.secret,
                namespace,
                &Value::Array(q).to_string(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "read back: {}", stderr(&out));
        let mut lines: Vec<Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let list = lines.pop().unwrap();
        (lines, list)
    }
}

/// Runs `svc-observe` with a clean environment: `PATH`, `HOME` = the test dir, plus `env`.
fn run(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", dir.path())
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn files(dir: &TempDir, cloud_b: Value, extra: &str) -> (String, String) {
    let snap = dir.write(
        "snapshot.json",
        &snapshot(
            &[("orders.eu.>", "orders_eu"), ("payments.>", "payments")],
            0.0,
        ),
    );
    let mut p: Value = serde_json::from_str(&policy(extra)).unwrap();
    p["cloud_b_monitoring"] = cloud_b;
    let pol = dir.write("policy.json", &p.to_string());
    (
        snap.to_str().unwrap().to_string(),
        pol.to_str().unwrap().to_string(),
    )
}

fn datapoints(v: &Value) -> &Vec<Value> {
    v["datapoints"].as_array().unwrap()
}

#[test]
fn values_and_statistic_sets_read_back_with_boto3() {
    let moto = Moto::start();
    let dir = TempDir::new("cloudb-values");
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "us-east-1", "metric_namespace": "svc/values",
               "unit": "Count", "dimensions": {"env": "prod", "service": "svc"},
               "max_metrics_per_request": 20}),
        "{}",
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[
            ("AWS_ACCESS_KEY_ID", &moto.key),
            ("AWS_SECRET_ACCESS_KEY", &moto.secret),
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &moto.url),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let counters = svc::metrics::Counters::NAMES.len();
    // every counter, the gauge, the four summaries: 20 per request
    let data = counters + 1 + svc::metrics::SUMMARY_NAMES.len();
    let requests = data.div_ceil(20);
    let line = stdout(&out);
    assert!(
        line.starts_with(&format!(
            "cloud-b-export: sent {data} metrics in {requests} requests ("
        )) && line.ends_with(&format!(" bytes) to {}/\n", moto.url)),
        "{line}"
    );
    let dims = json!({"env": "prod", "service": "svc"});
    let (got, list) = moto.stats(
        "svc/values",
        &[
            ("svc_messages_acked_total", dims.clone()),
            ("svc_last_sink_success_epoch_seconds", dims.clone()),
            ("svc_sink_batch_write_seconds", dims.clone()),
        ],
    );
    assert_eq!(
        datapoints(&got[0]),
        &vec![
            json!({"SampleCount": 1.0, "Sum": counter_value("messages_acked_total") as f64,
                     "Minimum": counter_value("messages_acked_total") as f64,
                     "Maximum": counter_value("messages_acked_total") as f64, "Unit": "Count"})
        ]
    );
    assert_eq!(datapoints(&got[1])[0]["Maximum"], json!(1_700_000_000.0));
    // observations 0.5, 0.25, 2.0: a statistic set, not a value
    assert_eq!(
        datapoints(&got[2]),
        &vec![
            json!({"SampleCount": 3.0, "Sum": 2.75, "Minimum": 0.25, "Maximum": 2.0, "Unit": "Count"})
        ]
    );
    // Shapes (moto matches dimensions loosely, so check the stored metric list too): every
    // datum has exactly the static dimensions, no family rows without the switch.
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), data);
    for m in list {
        assert_eq!(m["dimensions"], dims, "{m}");
    }
    let names: Vec<&str> = list.iter().map(|m| m["name"].as_str().unwrap()).collect();
    for c in svc::metrics::Counters::NAMES {
        assert!(names.contains(&format!("svc_{c}").as_str()), "{c}");
    }
}

#[test]
fn family_rows_become_dimensions_only_when_allowed() {
    let moto = Moto::start();
    let dir = TempDir::new("cloudb-families");
    let rules = r#"{"allowed_metrics": ["messages_written_total"], "allowed_metric_patterns": [],
        "subject_metrics": {"enabled": true, "rules": [{"subject": "orders.>", "label": "orders"},
        {"subject": "payments.>", "label": "payments", "display_mode": "hash"}]}}"#;
    for (ns, include) in [("svc/with", true), ("svc/without", false)] {
        let (snap, pol) = files(
            &dir,
            json!({"enabled": true, "region": "us-east-1", "metric_namespace": ns,
                   "include_metric_labels_as_dimensions": include}),
            rules,
        );
        let out = run(
            &dir,
            &["cloud-b-export", &snap, &pol],
            &[
                ("AWS_ACCESS_KEY_ID", &moto.key),
                ("AWS_SECRET_ACCESS_KEY", &moto.secret),
                ("AWS_ENDPOINT_URL", &moto.url),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let hash = svc::observe::families::short_hash("payments.>");
    let (got, list) = moto.stats(
        "svc/with",
        &[
            (
                "svc_messages_written_total",
                json!({"subject_family": "orders"}),
            ),
            (
                "svc_messages_written_total",
                json!({"subject_family": hash.clone()}),
            ),
        ],
    );
    assert_eq!(datapoints(&got[0])[0]["Sum"], json!(10.0));
    assert_eq!(datapoints(&got[1])[0]["Sum"], json!(20.0));
    assert_eq!(
        list,
        json!([
            {"name": "svc_messages_written_total", "dimensions": {}},
            {"name": "svc_messages_written_total", "dimensions": {"subject_family": hash}},
            {"name": "svc_messages_written_total", "dimensions": {"subject_family": "orders"}},
        ])
    );
    let (_, list) = moto.stats("svc/without", &[]);
    assert_eq!(
        list,
        json!([{"name": "svc_messages_written_total", "dimensions": {}}])
    );
}

#[test]
fn a_wrong_secret_fails_clearly_and_stores_nothing() {
    let moto = Moto::start();
    let dir = TempDir::new("cloudb-wrong");
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "us-east-1", "metric_namespace": "svc/wrong"}),
        "{}",
    );
    // Another last character: moto's random secret may itself end in the one chosen.
    let (head, last) = moto.secret.split_at(moto.secret.len() - 1);
    let wrong = format!("{head}{}", if last == "X" { "Y" } else { "X" });
    assert_ne!(wrong, moto.secret);
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[
            ("AWS_ACCESS_KEY_ID", &moto.key),
            ("AWS_SECRET_ACCESS_KEY", &wrong),
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &moto.url),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        // How many requests the plan has depends on the runner's metric count.
        err.starts_with("svc-observe cloud-b-export: cloud_b_monitoring: sent 0 of ")
            && err.contains("; last failure: PutMetricData request 1 of ")
            && err.contains(" (20 data): HTTP 403: "),
        "{err}"
    );
    assert!(err.contains("SignatureDoesNotMatch"), "{err}");
    assert!(err.trim_end().ends_with("(after 1 attempt)"), "{err}");
    for secret in [&wrong, &moto.secret] {
        assert!(!err.contains(secret.as_str()) && !stdout(&out).contains(secret.as_str()));
    }
    assert_eq!(moto.stats("svc/wrong", &[]).1, json!([]));
}

#[test]
fn shared_credentials_file_and_profile() {
    let moto = Moto::start();
    let dir = TempDir::new("cloudb-profile");
    std::fs::create_dir_all(dir.join(".aws")).unwrap();
    dir.write(
        ".aws/credentials",
        &format!(
            "[default]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = nope\n\n[metrics]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            moto.key, moto.secret
        ),
    );
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "us-east-1", "metric_namespace": "svc/profile",
               "max_metrics_per_request": 1000}),
        r#"{"allowed_metrics": ["messages_acked_total"], "allowed_metric_patterns": []}"#,
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[("AWS_PROFILE", "metrics"), ("AWS_ENDPOINT_URL", &moto.url)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("cloud-b-export: sent 1 metric in 1 request ("));
    assert_eq!(
        moto.stats("svc/profile", &[]).1,
        json!([{"name": "svc_messages_acked_total", "dimensions": {}}])
    );
}

/// The connector runs the same default chain as the sink: a `role_arn` profile goes through
/// moto's STS `AssumeRole` (signature checks on), and CloudWatch accepts data signed with the
/// temporary credentials; a wrong source secret is refused by STS before any PutMetricData.
#[test]
fn role_profile_through_sts_assume_role() {
    let moto = Moto::start();
    let out = Command::new(venv().join("bin/python"))
        .arg(helper())
        .args(["role", &moto.url, &moto.key, &moto.secret, "svc-metrics"])
        .output()
        .unwrap();
    assert!(out.status.success(), "role: {}", stderr(&out));
    let dir = TempDir::new("cloudb-role");
    std::fs::create_dir_all(dir.join(".aws")).unwrap();
    dir.write(
        ".aws/credentials",
        &format!(
            "[base]\naws_access_key_id = {k}\naws_secret_access_key = {s}\n\
             [wrong]\naws_access_key_id = {k}\naws_secret_access_key = not-the-secret-42\n",
            k = moto.key,
            s = moto.secret
        ),
    );
    dir.write(
        ".aws/config",
        "[profile metrics]\nrole_arn = arn:aws:iam::123456789012:role/svc-metrics\n\
         source_profile = base\n\
         [profile broken]\nrole_arn = arn:aws:iam::123456789012:role/svc-metrics\n\
         source_profile = wrong\n",
    );
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "us-east-1", "metric_namespace": "svc/role",
               "max_metrics_per_request": 1000}),
        r#"{"allowed_metrics": ["messages_acked_total"], "allowed_metric_patterns": []}"#,
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[("AWS_PROFILE", "metrics"), ("AWS_ENDPOINT_URL", &moto.url)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        moto.stats("svc/role", &[]).1,
        json!([{"name": "svc_messages_acked_total", "dimensions": {}}])
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[("AWS_PROFILE", "broken"), ("AWS_ENDPOINT_URL", &moto.url)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("STS AssumeRole at http://127.0.0.1:"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("not-the-secret-42"));
}

const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const TOKEN: &str = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN";
const AKID: &str = "AKIAIOSFODNN7EXAMPLE";

#[test]
fn dry_run_hides_credentials_and_region() {
    let dir = TempDir::new("cloudb-dry");
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "eu-west-3", "max_metrics_per_request": 1000}),
        "{}",
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol, "--dry-run"],
        &[
            ("AWS_ACCESS_KEY_ID", AKID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_SESSION_TOKEN", TOKEN),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    for s in [SECRET, TOKEN, AKID, "eu-west-3"] {
        assert!(!text.contains(s), "{s} leaked:\n{text}");
    }
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("# svc-observe cloud-b-export --dry-run: 1 request, "));
    assert_eq!(
        lines[1],
        "POST https://monitoring.<redacted>.amazonaws.com/"
    );
    assert_eq!(lines[2], "Host: monitoring.<redacted>.amazonaws.com");
    assert!(lines.contains(&"Authorization: <redacted>"));
    assert!(lines.contains(&"X-Amz-Security-Token: <redacted>"));
    assert!(
        lines
            .iter()
            .any(|l| l
                .starts_with("Action=PutMetricData&Version=2010-08-01&Namespace=svc%2Fmetrics&"))
    );
}

#[test]
fn oversize_and_missing_credentials_fail_before_any_request() {
    let dir = TempDir::new("cloudb-oversize");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (snap, pol) = files(
        &dir,
        json!({"enabled": true, "region": "us-east-1", "max_metrics_per_request": 1000,
               "max_request_bytes": 1024}),
        "{}",
    );
    let creds = [
        ("AWS_ACCESS_KEY_ID", AKID),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_ENDPOINT_URL_CLOUDWATCH", url.as_str()),
    ];
    let out = run(&dir, &["cloud-b-export", &snap, &pol], &creds);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("svc-observe cloud-b-export: PutMetricData request 1 of 1 (")
            && err.trim_end().ends_with(
                "bytes, over cloud_b_monitoring.max_request_bytes 1024; nothing was sent"
            ),
        "{err}"
    );
    assert!(listener.accept().is_err(), "a request was made");

    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[creds[2], ("AWS_EC2_METADATA_DISABLED", "true")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).starts_with("svc-observe cloud-b-export: cloud_b_monitoring: no AWS credentials found: checked AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE, profile default in "), "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with(", then instance metadata disabled by AWS_EC2_METADATA_DISABLED\n"),
        "{}",
        stderr(&out)
    );
    let out = run(
        &dir,
        &["cloud-b-export", &snap, &pol],
        &[
            ("AWS_ACCESS_KEY_ID", AKID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_ENDPOINT_URL", "http://monitoring.example.com"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "svc-observe cloud-b-export: cloud_b_monitoring: AWS_ENDPOINT_URL: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https\n");
    assert!(listener.accept().is_err(), "a request was made");
}
