//! Push receivers that misbehave on purpose, against the `svc-observe` binary: answers that
//! echo the request's secrets where a cut would split them, JSON-escaped, or whole next to
//! their parts; 200 answers that report a partial success or hold an error document.
//!
//! The receivers are `support::http::Receiver`s (each request parsed strictly and recorded, the
//! answer chosen by the test).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::support::http::{Received, Receiver};
use crate::support::observe::{policy, snapshot, stderr, stdout};
use crate::support::TempDir;
use serde_json::{json, Value};

/// `svc-observe` with a clean environment: `PATH`, `HOME` = the test dir, plus `env`.
fn run(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(crate::support::observe::bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", dir.path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A fresh snapshot and a policy with `blocks` merged in.
fn files(dir: &TempDir, blocks: Value) -> (PathBuf, PathBuf) {
    let snap = dir.write(
        "snapshot.json",
        &snapshot(&[("orders.eu.>", "orders_eu")], 0.0),
    );
    let mut p: Value = serde_json::from_str(&policy("{}")).unwrap();
    for (k, v) in blocks.as_object().unwrap() {
        p[k] = v.clone();
    }
    (snap, dir.write("policy.json", &p.to_string()))
}

/// No line of the output holds a secret, JSON-escaped or not, nor all but its last character.
fn assert_clean(o: &Output, secrets: &[&str]) {
    let all = format!("{}{}", stdout(o), stderr(o));
    for line in all.lines() {
        for s in secrets {
            for form in [
                s.to_string(),
                s.replace('/', "\\/"),
                s[..s.len() - 1].to_string(),
            ] {
                assert!(!line.contains(&form), "a secret ({form}) in: {line}");
            }
        }
    }
}

/// A collector whose 200 answer rejects the event and quotes the token where the 200-character
/// cut of the quote falls inside it, and again JSON-escaped. Cutting before scrubbing printed
/// 20 of the token's 21 characters.
#[test]
fn siem_hec_quoting_the_token_at_the_cut_prints_none_of_it() {
    const TOKEN: &str = "hec/Token+21-chars-xy";
    assert_eq!(TOKEN.len(), 21);
    let rx = Receiver::start_raw(Box::new(|_: &Received| {
        let text = format!("{}{TOKEN} {}", "p".repeat(180), TOKEN.replace('/', "\\/"));
        // The body is written by hand: `\/` must reach the wire as is.
        let body = format!(r#"{{"code": 7, "text": "{text}"}}"#);
        (200, "application/json", body.into_bytes())
    }));
    let dir = TempDir::new("hostile-hec");
    let (snap, pol) = files(
        &dir,
        json!({"siem_hec": {"enabled": true,
                            "endpoint": format!("{}/services/collector/event", rx.url()),
                            "token_env": "SVC_HEC_TOKEN"}}),
    );
    let o = run(
        &dir,
        &[
            "siem-hec-export",
            snap.to_str().unwrap(),
            pol.to_str().unwrap(),
        ],
        &[("SVC_HEC_TOKEN", TOKEN)],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the collector rejected the event: code 7"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        rx.requests()[0].header("authorization"),
        Some(format!("Splunk {TOKEN}").as_str())
    );
    assert_clean(&o, &[TOKEN]);
}

/// A CloudWatch endpoint answering 403 with the request's whole `Authorization` value, the
/// signature upper-cased and the key id. The connector used to replace the region and key id
/// first, so the whole value (and the signature in it) no longer matched.
#[test]
fn cloud_b_echoing_authorization_whole_and_in_parts_prints_none_of_it() {
    const KEY_ID: &str = "AKIAHOSTILERECEIVER1";
    const SECRET: &str = "cloud/B+secret/0123456789abcdefghijklmn";
    let rx = Receiver::start_raw(Box::new(|r: &Received| {
        let auth = r.header("authorization").unwrap_or_default().to_string();
        let sig = auth.split("Signature=").nth(1).unwrap_or_default();
        // The signature first: the excerpt is cut at 200 characters.
        let body = format!(
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>signature {sig} ({}) \
             key {KEY_ID} got {auth}</Message></Error></ErrorResponse>",
            sig.to_ascii_uppercase()
        );
        (403, "text/xml", body.into_bytes())
    }));
    let dir = TempDir::new("hostile-cloudb");
    let (snap, pol) = files(
        &dir,
        json!({"cloud_b_monitoring": {"enabled": true, "region": "us-west-2",
                                      "metric_namespace": "svc/hostile"}}),
    );
    let url = rx.url();
    let o = run(
        &dir,
        &[
            "cloud-b-export",
            snap.to_str().unwrap(),
            pol.to_str().unwrap(),
        ],
        &[
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &url),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("HTTP 403: "), "{}", stderr(&o));
    let sigs: Vec<String> = rx
        .requests()
        .iter()
        .filter_map(|r| r.header("authorization"))
        .filter_map(|a| a.split("Signature=").nth(1))
        .flat_map(|s| [s.to_string(), s.to_ascii_uppercase()])
        .collect();
    assert!(!sigs.is_empty());
    let mut secrets: Vec<&str> = vec![KEY_ID, SECRET];
    secrets.extend(sigs.iter().map(String::as_str));
    assert_clean(&o, &secrets);
}

/// An OTLP receiver that answers 200 with `partialSuccess.rejectedDataPoints: 45`: the export
/// reports the rejected points and fails (exit 1), once (a retry would duplicate the rest).
#[test]
fn otlp_partial_success_is_reported_as_a_failure() {
    let rx = Receiver::start_raw(Box::new(|_: &Received| {
        let body = json!({"partialSuccess": {"rejectedDataPoints": "45",
                                             "errorMessage": "45 points out of range\n"}});
        (200, "application/json", body.to_string().into_bytes())
    }));
    let dir = TempDir::new("hostile-otlp");
    let (snap, pol) = files(
        &dir,
        json!({"otlp": {"enabled": true, "endpoint": format!("{}/v1/metrics", rx.url()),
                        "max_retries": 2, "retry_backoff_seconds": 0}}),
    );
    let o = run(
        &dir,
        &["otlp-export", snap.to_str().unwrap(), pol.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "the receiver rejected 45 data points (partialSuccess: 45 points out of range\\n)"
        ),
        "{err}"
    );
    assert!(!stdout(&o).contains("sent "), "{}", stdout(&o));
    assert_eq!(rx.requests().len(), 1, "not retried");

    // No rejected points: a full success.
    let ok = Receiver::start_raw(Box::new(|_: &Received| {
        let body = json!({"partialSuccess": {"rejectedDataPoints": "0", "errorMessage": ""}});
        (200, "application/json", body.to_string().into_bytes())
    }));
    let (snap, pol) = files(
        &dir,
        json!({"otlp": {"enabled": true, "endpoint": format!("{}/v1/metrics", ok.url())}}),
    );
    let o = run(
        &dir,
        &["otlp-export", snap.to_str().unwrap(), pol.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A CloudWatch endpoint (or something in front of it) answering 200 with an error document.
#[test]
fn cloud_b_error_document_in_a_200_is_a_failure() {
    let rx = Receiver::start_raw(Box::new(|_: &Received| {
        let body = "<ErrorResponse><Error><Code>Throttling</Code><Message>Rate exceeded\
                    </Message></Error></ErrorResponse>";
        (200, "text/xml", body.as_bytes().to_vec())
    }));
    let dir = TempDir::new("hostile-cloudb-200");
    let (snap, pol) = files(
        &dir,
        json!({"cloud_b_monitoring": {"enabled": true, "region": "us-west-2",
                                      "metric_namespace": "svc/hostile"}}),
    );
    let url = rx.url();
    let o = run(
        &dir,
        &[
            "cloud-b-export",
            snap.to_str().unwrap(),
            pol.to_str().unwrap(),
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAHOSTILERECEIVER1"),
            (
                "AWS_SECRET_ACCESS_KEY",
                "cloud/B+secret/0123456789abcdefghijklmn",
            ),
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &url),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("the 2xx answer is an error document: Throttling: Rate exceeded"),
        "{}",
        stderr(&o)
    );
}

/// A cloud C endpoint that answers every request just inside the request timeout, and fails
/// it: without an overall deadline one export ran requests x attempts x timeout (121.6 s for
/// 45 metrics). With `export_deadline_seconds` 3 the run ends near 3 s, naming the deadline.
#[test]
fn cloud_c_export_ends_at_its_deadline() {
    let rx = Receiver::start_raw(Box::new(|_: &Received| {
        std::thread::sleep(std::time::Duration::from_millis(900));
        (503, "application/json", b"{\"error\": \"busy\"}".to_vec())
    }));
    let dir = TempDir::new("hostile-cloudc");
    let (snap, pol) = files(
        &dir,
        json!({"cloud_c_monitoring": {"enabled": true,
            "resource_id": "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
            "location": "westeurope", "token_env": "AZ_MONITOR_TOKEN",
            "timeout_seconds": 1, "max_retries": 3, "retry_backoff_seconds": 0.5,
            "export_deadline_seconds": 3}}),
    );
    let url = rx.url();
    let started = std::time::Instant::now();
    let o = run(
        &dir,
        &[
            "cloud-c-export",
            snap.to_str().unwrap(),
            pol.to_str().unwrap(),
        ],
        &[
            ("AZ_MONITOR_TOKEN", "cloud-c-token-0123456789"),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
        ],
    );
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "export deadline of 3 s reached (cloud_c_monitoring.export_deadline_seconds)"
        ),
        "{}",
        stderr(&o)
    );
    // The deadline plus the time to start and to notice it; without it: 45+ requests x 4
    // attempts x 0.9 s.
    assert!(took < std::time::Duration::from_secs(6), "took {took:?}");
    assert!(rx.requests().len() <= 4, "{} requests", rx.requests().len());
    assert_clean(&o, &["cloud-c-token-0123456789"]);
}

// -------------------------------------------------------------------------------------------
// One deadline per export run, for every push connector (cloud C's test above is the model).

/// The hostile timing every deadline test uses: 1 s per attempt, ten retries half a second
/// apart, and a 3 s deadline. Without the deadline a single request alone takes 11 x ~1.4 s.
fn slow_settings(block: Value) -> Value {
    let mut b = block;
    for (k, v) in [
        ("timeout_seconds", json!(1)),
        ("max_retries", json!(10)),
        ("retry_backoff_seconds", json!(0.5)),
        ("export_deadline_seconds", json!(3)),
    ] {
        b[k] = v;
    }
    b
}

/// A receiver that answers every request just inside the 1 s timeout, and fails it.
fn slow_receiver() -> Receiver {
    Receiver::start_raw(Box::new(|_: &Received| {
        std::thread::sleep(std::time::Duration::from_millis(900));
        (503, "application/json", b"{\"error\": \"busy\"}".to_vec())
    }))
}

/// Runs `command` with `block` (made slow) as the policy's `name` block and asserts the run
/// ended near its 3 s deadline, naming the field, without printing a secret.
fn assert_ends_at_deadline(
    dir: &TempDir,
    command: &str,
    name: &str,
    block: Value,
    env: &[(&str, &str)],
    secrets: &[&str],
) -> Output {
    let (snap, pol) = files(dir, json!({ name: slow_settings(block) }));
    let started = std::time::Instant::now();
    let o = run(
        dir,
        &[command, snap.to_str().unwrap(), pol.to_str().unwrap()],
        env,
    );
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let expected = format!("export deadline of 3 s reached ({name}.export_deadline_seconds)");
    assert!(stderr(&o).contains(&expected), "{}", stderr(&o));
    // The deadline plus the time to start and to notice it.
    assert!(
        took < std::time::Duration::from_secs(6),
        "{command} took {took:?}"
    );
    assert_clean(&o, secrets);
    o
}

/// At most the attempts that fit in 3 s: one every 1.4 s.
fn assert_few_requests(rx: &Receiver) {
    let n = rx.requests().len();
    assert!((1..=4).contains(&n), "{n} requests");
}

#[test]
fn otlp_export_ends_at_its_deadline() {
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-otlp");
    let block = json!({"enabled": true, "endpoint": format!("{}/v1/metrics", rx.url()),
                       "headers_env": {"X-Api-Key": "OTLP_KEY"}});
    let env = [("OTLP_KEY", "otlp-key-0123456789")];
    assert_ends_at_deadline(&dir, "otlp-export", "otlp", block, &env, &[env[0].1]);
    assert_few_requests(&rx);
}

#[test]
fn search_stack_export_ends_at_its_deadline() {
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-search");
    let block = json!({"enabled": true, "endpoint": format!("{}/v1/metrics", rx.url())});
    assert_ends_at_deadline(&dir, "search-stack-export", "search_stack", block, &[], &[]);
    assert_few_requests(&rx);
}

#[test]
fn collector_agent_export_ends_at_its_deadline() {
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-collector");
    let block = json!({"enabled": true, "endpoint": format!("{}/v1/metrics", rx.url())});
    assert_ends_at_deadline(
        &dir,
        "collector-agent-export",
        "collector_agent",
        block,
        &[],
        &[],
    );
    assert_few_requests(&rx);
}

#[test]
fn siem_hec_export_ends_at_its_deadline() {
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-hec");
    let block = json!({"enabled": true,
                       "endpoint": format!("{}/services/collector/event", rx.url()),
                       "token_env": "SVC_HEC_TOKEN"});
    let env = [("SVC_HEC_TOKEN", "hec-token-0123456789")];
    assert_ends_at_deadline(
        &dir,
        "siem-hec-export",
        "siem_hec",
        block,
        &env,
        &[env[0].1],
    );
    assert_few_requests(&rx);
}

#[test]
fn cloud_a_export_ends_at_its_deadline() {
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-clouda");
    let key = dir.join("api.pem");
    let out = Command::new("openssl")
        .args(["genrsa", "-out", key.to_str().unwrap(), "2048"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config = dir.write(
        "oci-config",
        &format!(
            "[DEFAULT]\nuser=ocid1.user.oc1..aaaatestuserxyz\n\
             fingerprint=20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\n\
             tenancy=ocid1.tenancy.oc1..aaaatesttenancyxyz\nregion=eu-frankfurt-1\nkey_file={}\n",
            key.display()
        ),
    );
    let block = json!({"enabled": true, "region": "eu-frankfurt-1",
                       "compartment_id": "ocid1.compartment.oc1..aaaatestcompartmentxyz",
                       "auth_mode": "config_file", "config_file": config});
    let url = rx.url();
    assert_ends_at_deadline(
        &dir,
        "cloud-a-export",
        "cloud_a_monitoring",
        block,
        &[("SVC_CLOUD_A_ENDPOINT_OVERRIDE", &url)],
        &[],
    );
    assert_few_requests(&rx);
}

#[test]
fn cloud_b_export_ends_at_its_deadline() {
    const SECRET: &str = "cloud/B+secret/0123456789abcdefghijklmn";
    let rx = slow_receiver();
    let dir = TempDir::new("deadline-cloudb");
    let block = json!({"enabled": true, "region": "us-west-2", "metric_namespace": "svc/hostile"});
    let url = rx.url();
    assert_ends_at_deadline(
        &dir,
        "cloud-b-export",
        "cloud_b_monitoring",
        block,
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAHOSTILERECEIVER1"),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &url),
        ],
        &[SECRET],
    );
    assert_few_requests(&rx);
}

/// A Unix datagram receiver that never reads: once its queue is full (10 datagrams by
/// default) every send blocks for the whole timeout. Without the deadline the run took
/// datagrams x attempts x timeout.
fn datagram_connector_ends_at_its_deadline(command: &str, name: &str) {
    let dir = TempDir::new(&format!("deadline-{name}"));
    let path = dir.join("receiver.sock");
    let _receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let block = json!({"enabled": true, "transport": "unixgram",
                       "socket_path": path.to_str().unwrap()});
    let o = assert_ends_at_deadline(&dir, command, name, block, &[], &[]);
    // Some went through before the queue filled; the run says how many.
    assert!(
        stderr(&o).contains(&format!("{name}: sent ")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn statsd_export_ends_at_its_deadline() {
    datagram_connector_ends_at_its_deadline("statsd-export", "statsd");
}

#[test]
fn agent_statsd_export_ends_at_its_deadline() {
    datagram_connector_ends_at_its_deadline("agent-statsd-export", "agent_statsd");
}

#[test]
fn syslog_export_ends_at_its_deadline() {
    datagram_connector_ends_at_its_deadline("syslog-export", "syslog");
}
