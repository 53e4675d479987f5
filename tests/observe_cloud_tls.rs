//! One real TLS handshake per HTTPS client of this branch (cloud A, B, C exports and the broker
//! monitoring poll) against `openssl s_server -www`: a self-signed certificate must give a
//! clean "invalid peer certificate" error and exit 1 (never a panic: rustls 0.23 panics when no
//! single process-wide crypto provider can be chosen), and a certificate of a CA trusted through configuration
//! (`SSL_CERT_FILE` for the exports, `ca_file` for the poll) must pass the handshake (the
//! `-www` server then answers the poll's GET with its HTML status page, "not valid JSON", and
//! leaves an export's POST unanswered until the timeout: non-TLS errors after a handshake).

use std::process::{Command, Output, Stdio};

use crate::support::certs::{make_certs, Certs, TlsServer};
use crate::support::observe::*;
use crate::support::TempDir;
use serde_json::{json, Value};

/// `openssl s_server -www` with the given certificate on a free port: (server, port).
fn s_server(cert: &std::path::Path, key: &std::path::Path) -> (TlsServer, u16) {
    let server = TlsServer::start(cert, key);
    let port = server.port;
    (server, port)
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn assert_clean_cert_error(o: &Output, what: &str) {
    assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(o));
    let err = stderr(o);
    assert!(err.contains("invalid peer certificate"), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

fn assert_handshake_passed(o: &Output, what: &str) {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(
        !err.contains("certificate") && !err.contains("tls") && !err.contains("TLS"),
        "{what}: the handshake failed: {err}"
    );
    // `s_server -www` does not answer a POST: the request times out after the handshake.
    assert!(err.contains("timed out"), "{what}: {err}");
}

struct Env {
    dir: TempDir,
    certs: Certs,
    snap: String,
}

fn setup(tag: &str) -> Env {
    let dir = TempDir::new(tag);
    let certs = make_certs(dir.path());
    let snap = dir
        .write("snap.json", &snapshot(&[], 0.0))
        .to_str()
        .unwrap()
        .to_string();
    Env { dir, certs, snap }
}

fn export_policy(e: &Env, block: &str, cfg: Value) -> String {
    let mut p: Value = serde_json::from_str(&policy(
        r#"{"allowed_metrics": ["messages_acked_total"], "allowed_metric_patterns": []}"#,
    ))
    .unwrap();
    p[block] = cfg;
    e.dir
        .write(&format!("{block}.json"), &p.to_string())
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn cloud_b_verifies_the_endpoint_certificate() {
    let e = setup("tls-cloudb");
    let pol = export_policy(
        &e,
        "cloud_b_monitoring",
        json!({"enabled": true, "region": "us-east-1", "timeout_seconds": 1}),
    );
    let creds = [
        ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        ),
    ];
    let (_rogue, port) = s_server(&e.certs.rogue_cert, &e.certs.rogue_key);
    let url = format!("https://localhost:{port}");
    let o = run(
        &["cloud-b-export", &e.snap, &pol],
        &[creds[0], creds[1], ("AWS_ENDPOINT_URL_CLOUDWATCH", &url)],
    );
    assert_clean_cert_error(&o, "cloud B, self-signed");
    let (_good, port) = s_server(&e.certs.cert, &e.certs.key);
    let url = format!("https://localhost:{port}");
    let ca = e.certs.ca.to_str().unwrap();
    let o = run(
        &["cloud-b-export", &e.snap, &pol],
        &[
            creds[0],
            creds[1],
            ("AWS_ENDPOINT_URL_CLOUDWATCH", &url),
            ("SSL_CERT_FILE", ca),
        ],
    );
    assert_handshake_passed(&o, "cloud B, trusted CA");
}

#[test]
fn cloud_c_verifies_the_endpoint_certificate() {
    let e = setup("tls-cloudc");
    let pol = export_policy(
        &e,
        "cloud_c_monitoring",
        json!({"enabled": true, "resource_id": "/subscriptions/s/resourceGroups/g/providers/p/x",
               "location": "westeurope", "token_env": "AZ_TOKEN", "timeout_seconds": 1}),
    );
    let (_rogue, port) = s_server(&e.certs.rogue_cert, &e.certs.rogue_key);
    let url = format!("https://localhost:{port}");
    let o = run(
        &["cloud-c-export", &e.snap, &pol],
        &[
            ("AZ_TOKEN", "secret-token"),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
        ],
    );
    assert_clean_cert_error(&o, "cloud C, self-signed");
    assert!(!stderr(&o).contains("secret-token"));
    let (_good, port) = s_server(&e.certs.cert, &e.certs.key);
    let url = format!("https://localhost:{port}");
    let o = run(
        &["cloud-c-export", &e.snap, &pol],
        &[
            ("AZ_TOKEN", "secret-token"),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
            ("SSL_CERT_FILE", e.certs.ca.to_str().unwrap()),
        ],
    );
    assert_handshake_passed(&o, "cloud C, trusted CA");
}

#[test]
fn cloud_a_verifies_the_endpoint_certificate() {
    let e = setup("tls-clouda");
    let key = e.dir.join("api.pem");
    let o = Command::new("openssl")
        .args(["genrsa", "-out", key.to_str().unwrap(), "2048"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let cfg = e.dir.write(
        "oci-config",
        &format!(
            "[DEFAULT]\nuser=ocid1.user.oc1..aaaa\nfingerprint=20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\ntenancy=ocid1.tenancy.oc1..aaaa\nkey_file={}\n",
            key.display()
        ),
    );
    let pol = export_policy(
        &e,
        "cloud_a_monitoring",
        json!({"enabled": true, "region": "eu-frankfurt-1",
               "compartment_id": "ocid1.compartment.oc1..aaaa", "auth_mode": "config_file",
               "config_file": cfg, "timeout_seconds": 1}),
    );
    let (_rogue, port) = s_server(&e.certs.rogue_cert, &e.certs.rogue_key);
    let url = format!("https://localhost:{port}");
    let o = run(
        &["cloud-a-export", &e.snap, &pol],
        &[("SVC_CLOUD_A_ENDPOINT_OVERRIDE", &url)],
    );
    assert_clean_cert_error(&o, "cloud A, self-signed");
    let (_good, port) = s_server(&e.certs.cert, &e.certs.key);
    let url = format!("https://localhost:{port}");
    let o = run(
        &["cloud-a-export", &e.snap, &pol],
        &[
            ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", &url),
            ("SSL_CERT_FILE", e.certs.ca.to_str().unwrap()),
        ],
    );
    assert_handshake_passed(&o, "cloud A, trusted CA");
}

#[test]
fn broker_poll_verifies_the_certificate_or_trusts_ca_file() {
    let e = setup("tls-broker");
    let poll = |block: Value| {
        let mut b = json!({"enabled": true, "scrape_enabled": true, "allowed_endpoints": ["/varz"],
                           "allowed_fields": ["mem"]});
        for (k, v) in block.as_object().unwrap() {
            b[k] = v.clone();
        }
        let p = json!({"schema": "svc.observability.policy.v1", "enabled": true,
                       "broker_server_monitoring": b});
        let path = e.dir.write("broker.json", &p.to_string());
        run(
            &[
                "broker-monitoring-poll",
                path.to_str().unwrap(),
                "--dry-run",
            ],
            &[],
        )
    };
    let (_rogue, rogue_port) = s_server(&e.certs.rogue_cert, &e.certs.rogue_key);
    let (_good, good_port) = s_server(&e.certs.cert, &e.certs.key);
    let o = poll(json!({"base_url": format!("https://localhost:{rogue_port}")}));
    assert_clean_cert_error(&o, "broker, self-signed");
    // the CA-signed server is not trusted without ca_file (Mozilla roots only)
    let o = poll(json!({"base_url": format!("https://localhost:{good_port}")}));
    assert_clean_cert_error(&o, "broker, unknown CA");
    // ca_file trusts it: the handshake passes, the -www page is not JSON
    let o = poll(json!({"base_url": format!("https://localhost:{good_port}"),
                        "ca_file": e.certs.ca.to_str().unwrap()}));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: the response is not valid JSON\n"
    );
    // ca_file does not make another CA's certificate acceptable
    let o = poll(
        json!({"base_url": format!("https://localhost:{rogue_port}"),
                        "ca_file": e.certs.ca.to_str().unwrap()}),
    );
    assert_clean_cert_error(&o, "broker, rogue with ca_file");
    // verify_tls false (loopback only): accepted without verification
    let o =
        poll(json!({"base_url": format!("https://localhost:{rogue_port}"), "verify_tls": false}));
    assert_eq!(
        stderr(&o),
        "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: the response is not valid JSON\n"
    );
}
