//! `cloud-a-export` (OCI Monitoring PostMetricData) against a strict local receiver that checks
//! the path, the headers, the body schema and VERIFIES the RSA request signature: it rebuilds
//! the signing string from the headers it received, in the order the `headers` parameter
//! names, and has `openssl dgst -sha256 -verify` check it against the test key pair's public
//! key (generated with `openssl genrsa` / `openssl rsa -pubout`). No OCI service can run here;
//! the receiver is reached through the test-only `SVC_CLOUD_A_ENDPOINT_OVERRIDE` (loopback only).
//!
//! `instance_principal` runs against a fake instance metadata service and a fake federation
//! service (loopback, `SVC_OCI_METADATA_OVERRIDE` / `SVC_OCI_FEDERATION_OVERRIDE`) holding an
//! openssl-made CA -> intermediate -> leaf chain. The federation fake verifies the request
//! signature with the leaf's public key and every body field, and answers a token; the metrics
//! receiver then verifies PostMetricData against the session public key posted to it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::support::http::{keys_exactly, rfc3339_age, Received, Receiver};
use crate::support::observe::*;
use crate::support::TempDir;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const COMPARTMENT: &str = "ocid1.compartment.oc1..aaaatestcompartmentxyz";
const TENANCY: &str = "ocid1.tenancy.oc1..aaaatesttenancyxyz";
const USER: &str = "ocid1.user.oc1..aaaatestuserxyz";
const FINGERPRINT: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";
const REGION: &str = "eu-frankfurt-1";
const SIGNED: &str = "date (request-target) host content-length content-type x-content-sha256";

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A key pair: (private PEM path, public PEM path).
fn key_pair(dir: &TempDir, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(&format!("{name}.pem"));
    let public = dir.join(&format!("{name}.pub.pem"));
    openssl(&["genrsa", "-out", key.to_str().unwrap(), "2048"]);
    openssl(&[
        "rsa",
        "-in",
        key.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    (key, public)
}

/// `Signature k="v",k="v"` -> map.
fn signature_params(header: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let rest = header
        .strip_prefix("Signature ")
        .ok_or("authorization is not a Signature")?;
    let mut out = std::collections::BTreeMap::new();
    for part in rest.split(',') {
        let (k, v) = part.split_once('=').ok_or("bad parameter")?;
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .ok_or("unquoted parameter")?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("parameter {k} repeated"));
        }
    }
    Ok(out)
}

fn parse_http_date(text: &str) -> Result<f64, String> {
    let fmt = time::format_description::parse_borrowed::<2>(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT",
    )
    .unwrap();
    let t = time::PrimitiveDateTime::parse(text, &fmt)
        .map_err(|e| format!("date {text:?}: {e}"))?
        .assume_utc();
    Ok((time::OffsetDateTime::now_utc() - t).as_seconds_f64())
}

/// Verifies the request signature with openssl against `public`.
fn verify_signature(
    r: &Received,
    public: &Path,
    scratch: &Path,
    key_id: &str,
) -> Result<(), String> {
    verify_signature_of(r, public, scratch, key_id, SIGNED)
}

/// Verifies the request signature, which must sign exactly `signed` (in that order).
fn verify_signature_of(
    r: &Received,
    public: &Path,
    scratch: &Path,
    key_id: &str,
    signed: &str,
) -> Result<(), String> {
    let auth = r.header("authorization").ok_or("no authorization")?;
    let p = signature_params(auth)?;
    let keys: Vec<&str> = p.keys().map(String::as_str).collect();
    if keys != ["algorithm", "headers", "keyId", "signature", "version"] {
        return Err(format!("signature parameters {keys:?}"));
    }
    if p["version"] != "1" || p["algorithm"] != "rsa-sha256" || p["headers"] != signed {
        return Err("bad version, algorithm or headers".into());
    }
    if p["keyId"] != key_id {
        return Err("unexpected keyId".into());
    }
    let mut lines = Vec::new();
    for h in p["headers"].split(' ') {
        if h == "(request-target)" {
            lines.push(format!(
                "(request-target): {} {}",
                r.method.to_ascii_lowercase(),
                r.target
            ));
        } else {
            lines.push(format!(
                "{h}: {}",
                r.header(h)
                    .ok_or_else(|| format!("signed header {h} missing"))?
            ));
        }
    }
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let data = scratch.join(format!("signed-{n}.txt"));
    let sig = scratch.join(format!("signed-{n}.sig"));
    std::fs::write(&data, lines.join("\n")).unwrap();
    std::fs::write(
        &sig,
        STANDARD
            .decode(&p["signature"])
            .map_err(|_| "signature is not base64")?,
    )
    .unwrap();
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(public)
        .arg("-signature")
        .arg(&sig)
        .arg(&data)
        .output()
        .unwrap();
    if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Verified OK") {
        Ok(())
    } else {
        Err("signature verification failed".into())
    }
}

/// The strict check of one request.
fn validate(
    r: &Received,
    host: &str,
    public: &Path,
    scratch: &Path,
    key_id: &str,
    max_entries: usize,
) -> Result<(), (u16, String)> {
    let bad = |why: String| {
        (
            400,
            json!({"code": "InvalidParameter", "message": why}).to_string(),
        )
    };
    if r.method != "POST" || r.target != "/20180401/metrics" || r.version != "HTTP/1.1" {
        return Err(bad(format!("unexpected {} {}", r.method, r.target)));
    }
    if r.header("host") != Some(host) || r.header("content-type") != Some("application/json") {
        return Err(bad("bad host or content-type".into()));
    }
    if r.header("content-length") != Some(&r.body.len().to_string()) {
        return Err(bad("content-length does not match".into()));
    }
    let digest = STANDARD.encode(Sha256::digest(&r.body));
    if r.header("x-content-sha256") != Some(&digest) {
        return Err(bad("x-content-sha256 does not match the body".into()));
    }
    let skew =
        parse_http_date(r.header("date").ok_or_else(|| bad("no date".into()))?).map_err(bad)?;
    if skew.abs() > 300.0 {
        return Err(bad("date skew over 5 minutes".into()));
    }
    verify_signature(r, public, scratch, key_id).map_err(|why| {
        (
            401,
            json!({"code": "NotAuthenticated", "message": why}).to_string(),
        )
    })?;
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| bad(format!("not JSON: {e}")))?;
    keys_exactly(&v, "body", &["metricData", "batchAtomicity"], &[]).map_err(bad)?;
    if !["ATOMIC", "NON_ATOMIC"].contains(&v["batchAtomicity"].as_str().unwrap_or("")) {
        return Err(bad("bad batchAtomicity".into()));
    }
    let data = v["metricData"]
        .as_array()
        .ok_or_else(|| bad("metricData".into()))?;
    if data.is_empty() || data.len() > max_entries {
        return Err(bad(format!("{} entries", data.len())));
    }
    for m in data {
        keys_exactly(
            m,
            "metricData[]",
            &[
                "namespace",
                "compartmentId",
                "name",
                "dimensions",
                "datapoints",
            ],
            &["metadata", "resourceGroup"],
        )
        .map_err(bad)?;
        let ns = m["namespace"].as_str().unwrap_or("");
        let ns_ok = ns.starts_with(|c: char| c.is_ascii_alphabetic())
            && ns.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !ns.starts_with("oci_")
            && !ns.starts_with("oracle_");
        let name = m["name"].as_str().unwrap_or("");
        let name_ok = name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-$".contains(&b));
        if !ns_ok || !name_ok || m["compartmentId"] != COMPARTMENT {
            return Err(bad(format!("bad namespace, name or compartment in {name}")));
        }
        let dims = m["dimensions"]
            .as_object()
            .ok_or_else(|| bad("dimensions".into()))?;
        if dims.is_empty() || dims.values().any(|v| v.as_str().is_none_or(str::is_empty)) {
            return Err(bad("dimensions must be non-empty strings".into()));
        }
        let points = m["datapoints"]
            .as_array()
            .ok_or_else(|| bad("datapoints".into()))?;
        if points.is_empty() {
            return Err(bad("no datapoints".into()));
        }
        for p in points {
            keys_exactly(p, "datapoint", &["timestamp", "value"], &["count"]).map_err(bad)?;
            let age = rfc3339_age(p["timestamp"].as_str().unwrap_or("")).map_err(bad)?;
            if !(-600.0..=7200.0).contains(&age) || p["value"].as_f64().is_none() {
                return Err(bad("bad timestamp or value".into()));
            }
            if let Some(c) = p.get("count") {
                if c.as_u64().is_none_or(|c| c == 0) {
                    return Err(bad("count must be a positive integer".into()));
                }
            }
        }
    }
    Ok(())
}

struct Setup {
    dir: TempDir,
    rx: Receiver,
    key: PathBuf,
    public: PathBuf,
}

/// A receiver that verifies signatures against `public_of` and expects `key_id`.
fn setup(tag: &str, key_id: impl Fn(&Path) -> String, max_entries: usize) -> Setup {
    let dir = TempDir::new(tag);
    let (key, public) = key_pair(&dir, "api");
    let scratch = dir.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let expected = key_id(dir.path());
    let host = Arc::new(std::sync::OnceLock::<String>::new());
    let (h, pubkey) = (host.clone(), public.clone());
    let rx = Receiver::start(Box::new(move |r| {
        match validate(
            r,
            h.get().unwrap(),
            &pubkey,
            &scratch,
            &expected,
            max_entries,
        ) {
            Ok(()) => (
                200,
                r#"{"failedMetricsCount": 0, "failedMetrics": []}"#.into(),
            ),
            Err(reply) => reply,
        }
    }));
    host.set(rx.addr.to_string()).unwrap();
    Setup {
        dir,
        rx,
        key,
        public,
    }
}

fn config_file(s: &Setup, key: &Path) -> String {
    s.dir
        .write(
            "oci-config",
            &format!(
                "[DEFAULT]\nuser={USER}\nfingerprint={FINGERPRINT}\ntenancy={TENANCY}\nregion={REGION}\nkey_file={}\n",
                key.display()
            ),
        )
        .to_str()
        .unwrap()
        .to_string()
}

fn files(s: &Setup, cloud_a: Value, extra: &str, age: f64) -> (String, String) {
    let snap = s.dir.write(
        "snapshot.json",
        &snapshot(
            &[("orders.eu.>", "orders_eu"), ("payments.>", "payments")],
            age,
        ),
    );
    let mut p: Value = serde_json::from_str(&policy(extra)).unwrap();
    let mut block = json!({"enabled": true, "region": REGION, "compartment_id": COMPARTMENT,
                           "auth_mode": "config_file"});
    for (k, v) in cloud_a.as_object().unwrap() {
        block[k] = v.clone();
    }
    p["cloud_a_monitoring"] = block;
    let pol = s.dir.write("policy.json", &p.to_string());
    (snap.to_str().unwrap().into(), pol.to_str().unwrap().into())
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

fn api_key_id(_: &Path) -> String {
    format!("{TENANCY}/{USER}/{FINGERPRINT}")
}

fn entries(rx: &Receiver) -> Vec<Value> {
    rx.requests()
        .iter()
        .flat_map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["metricData"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect()
}

#[test]
fn config_file_mode_requests_are_signed_and_verified_by_openssl() {
    let s = setup("clouda-config", api_key_id, 20);
    let cfg = config_file(&s, &s.key);
    let (snap, pol) = files(
        &s,
        json!({"config_file": cfg, "max_metrics_per_request": 20,
               "dimensions": {"source": "svc", "env": "prod"}, "metadata": {"team": "platform"},
               "resource_group": "svc-prod", "include_metric_labels_as_dimensions": true}),
        r#"{"subject_metrics": {"enabled": true, "rules": [{"subject": "orders.>", "label": "orders"}]}}"#,
        0.0,
    );
    let url = s.rx.url();
    let out = run(
        &["cloud-a-export", &snap, &pol],
        &[("SVC_CLOUD_A_ENDPOINT_OVERRIDE", &url)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let counters = svc::metrics::Counters::NAMES.len();
    // counters + gauge + every summary x 3 entries (value, min, max) + 5 family rows (orders only)
    let n = counters + 1 + svc::metrics::SUMMARY_NAMES.len() * 3 + 5;
    let requests = n.div_ceil(20);
    assert_eq!(s.rx.requests().len(), requests);
    assert!(
        stdout(&out).starts_with(&format!(
            "cloud-a-export: sent {n} metrics in {requests} requests ("
        )),
        "{}",
        stdout(&out)
    );
    let all = entries(&s.rx);
    assert_eq!(all.len(), n);
    let find = |name: &str, family: bool| {
        all.iter()
            .find(|e| {
                e["name"] == name && e["dimensions"].get("subject_family").is_some() == family
            })
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let e = find("svc_messages_acked_total", false);
    assert_eq!(e["dimensions"], json!({"env": "prod", "source": "svc"}));
    assert_eq!(e["metadata"], json!({"team": "platform"}));
    assert_eq!(e["resourceGroup"], "svc-prod");
    assert_eq!(e["namespace"], "svc_metrics");
    assert_eq!(
        e["datapoints"][0]["value"],
        json!(counter_value("messages_acked_total") as f64)
    );
    let e = find("svc_messages_written_total", true);
    assert_eq!(
        e["dimensions"],
        json!({"env": "prod", "source": "svc", "subject_family": "orders"})
    );
    assert_eq!(e["datapoints"][0]["value"], json!(10.0));
    // observations 0.5, 0.25, 2.0: weighted mean with count, then min and max
    let e = find("svc_sink_batch_write_seconds", false);
    assert_eq!(e["datapoints"][0]["count"], json!(3));
    assert!((e["datapoints"][0]["value"].as_f64().unwrap() - 2.75 / 3.0).abs() < 1e-12);
    assert_eq!(
        find("svc_sink_batch_write_seconds_min", false)["datapoints"][0]["value"],
        json!(0.25)
    );
    assert_eq!(
        find("svc_sink_batch_write_seconds_max", false)["datapoints"][0]["value"],
        json!(2.0)
    );
    let text = format!("{}{}", stdout(&out), stderr(&out));
    for secret in [COMPARTMENT, TENANCY, USER, FINGERPRINT, REGION] {
        assert!(!text.contains(secret), "{secret} printed: {text}");
    }
}

fn jwt(exp: i64) -> String {
    let part = |v: &str| URL_SAFE_NO_PAD.encode(v.as_bytes());
    format!(
        "{}.{}.{}",
        part(r#"{"alg":"RS256","kid":"asw"}"#),
        part(&format!(
            r#"{{"exp":{exp},"res_type":"fnfunc","ttype":"res"}}"#
        )),
        part("signature-of-the-token")
    )
}

#[test]
fn resource_principal_mode_signs_with_the_session_token() {
    let token = jwt(time::OffsetDateTime::now_utc().unix_timestamp() + 900);
    let t = token.clone();
    let s = setup("clouda-rp", move |_| format!("ST${t}"), 50);
    let token_file = s.dir.write("rpst", &token);
    let pem = std::fs::read_to_string(&s.key).unwrap();
    let (snap, pol) = files(
        &s,
        json!({"auth_mode": "resource_principal", "max_metrics_per_request": 50,
               "batch_atomicity": "NON_ATOMIC"}),
        r#"{"allowed_metric_patterns": ["messages_*"]}"#,
        0.0,
    );
    let url = s.rx.url();
    let env = [
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
        ("OCI_RESOURCE_PRINCIPAL_VERSION", "2.2"),
        ("OCI_RESOURCE_PRINCIPAL_RPST", token_file.to_str().unwrap()),
        ("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM", pem.as_str()),
        (
            "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE",
            "passphrase-not-needed",
        ),
        ("OCI_RESOURCE_PRINCIPAL_REGION", REGION),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let reqs = s.rx.requests();
    assert_eq!(reqs.len(), 1);
    let body: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(body["batchAtomicity"], "NON_ATOMIC");
    // the dry run shows the request without the token, the key or the passphrase
    let dry = run(&["cloud-a-export", &snap, &pol, "--dry-run"], &env);
    assert!(dry.status.success(), "{}", stderr(&dry));
    for o in [&out, &dry] {
        let text = format!("{}{}", stdout(o), stderr(o));
        let key_line = pem.lines().nth(1).unwrap();
        for secret in [
            token.as_str(),
            key_line,
            "passphrase-not-needed",
            COMPARTMENT,
            REGION,
        ] {
            assert!(!text.contains(secret), "{secret} printed:\n{text}");
        }
    }
    let text = stdout(&dry);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], format!("POST {url}/20180401/metrics"));
    assert!(lines.contains(&"authorization: <redacted>"), "{text}");
    assert!(text.contains("\"compartmentId\":\"<redacted>\""), "{text}");
    assert_eq!(s.rx.requests().len(), 1, "the dry run sent nothing");
    // an expired token is refused before any request
    let expired = s.dir.write("rpst-old", &jwt(1_000_000));
    let mut env2 = env;
    env2[2] = ("OCI_RESOURCE_PRINCIPAL_RPST", expired.to_str().unwrap());
    let out = run(&["cloud-a-export", &snap, &pol], &env2);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the resource principal session token expired"),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.rx.requests().len(), 1);
}

#[test]
fn wrong_key_partial_rejection_and_dry_run() {
    let s = setup("clouda-reject", api_key_id, 50);
    // a key the receiver does not know: its signature fails verification (401)
    let (other, _) = key_pair(&s.dir, "other");
    let cfg = config_file(&s, &other);
    let (snap, pol) = files(
        &s,
        json!({"config_file": cfg, "max_metrics_per_request": 50}),
        r#"{"allowed_metrics": ["messages_acked_total"], "allowed_metric_patterns": []}"#,
        0.0,
    );
    let url = s.rx.url();
    let env = [("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str())];
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("svc-observe cloud-a-export: cloud_a_monitoring: sent 0 of 1; last failure: PostMetricData request 1 of 1 (1 entries): HTTP 401: {\"code\":\"NotAuthenticated\",\"message\":\"signature verification failed\"}"),
        "{}",
        stderr(&out)
    );
    // the right key, but OCI reports a rejected entry inside a 200 (NON_ATOMIC)
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let rx = Receiver::start(Box::new(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        (
            200,
            json!({"failedMetricsCount": 1, "failedMetrics": [{"message": "dimension value too long",
                    "metricData": {"compartmentId": COMPARTMENT}}]})
            .to_string(),
        )
    }));
    let cfg = config_file(&s, &s.key);
    let (snap, pol) = files(
        &s,
        json!({"config_file": cfg, "batch_atomicity": "NON_ATOMIC", "max_retries": 3,
               "retry_backoff_seconds": 0}),
        r#"{"allowed_metrics": ["messages_acked_total"], "allowed_metric_patterns": []}"#,
        0.0,
    );
    let url2 = rx.url();
    let out = run(
        &["cloud-a-export", &snap, &pol],
        &[("SVC_CLOUD_A_ENDPOINT_OVERRIDE", &url2)],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).ends_with("PostMetricData request 1 of 1 (1 entries): OCI rejected 1 metric of the batch (first: dimension value too long) (after 1 attempt)\n"), "{}", stderr(&out));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a rejection is not retried"
    );
    // the dry run: compartment, region, key id and signature hidden
    let out = run(&["cloud-a-export", &snap, &pol, "--dry-run"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "POST https://telemetry-ingestion.<redacted>.oraclecloud.com/20180401/metrics\n"
        ),
        "{text}"
    );
    assert!(text.contains("host: telemetry-ingestion.<redacted>.oraclecloud.com\n"));
    assert!(text.contains("content-type: application/json\n"));
    assert!(text.contains("x-content-sha256: "));
    assert!(text.contains("authorization: <redacted>\n"));
    for secret in [
        COMPARTMENT,
        TENANCY,
        USER,
        FINGERPRINT,
        REGION,
        "Signature version",
    ] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    let _ = &s.public;
}

#[test]
fn failures_before_any_request() {
    let s = setup("clouda-before", api_key_id, 50);
    let cfg = config_file(&s, &s.key);
    let url = s.rx.url();
    let env = [("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str())];
    // oversize
    let (snap, pol) = files(
        &s,
        json!({"config_file": cfg, "max_metrics_per_request": 50, "max_request_bytes": 2048}),
        "{}",
        0.0,
    );
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        // How many requests the plan has depends on the runner's metric count; the first is
        // already over the limit.
        stderr(&out).starts_with("svc-observe cloud-a-export: PostMetricData request 1 of ")
            && stderr(&out).trim_end().ends_with(
                "bytes, over cloud_a_monitoring.max_request_bytes 2048; nothing was sent"
            ),
        "{}",
        stderr(&out)
    );
    // older than OCI's two-hour window
    let (snap, pol) = files(&s, json!({"config_file": cfg}), "{}", 7300.0);
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "the snapshot is 7300 s old; OCI Monitoring accepts data points at most 7200 s old"
        ),
        "{}",
        stderr(&out)
    );
    // instance principal (the default) is valid and implemented: validate-policy is quiet
    let (_, pol) = files(&s, json!({"auth_mode": "instance_principal"}), "{}", 0.0);
    let v = run(&["validate-policy", &pol], &[]);
    assert_eq!(v.status.code(), Some(0));
    assert!(stdout(&v).starts_with("Observability policy is valid.\n"));
    assert_eq!(stderr(&v), "");
    // an encrypted key is refused without echoing the passphrase
    let enc = s.dir.join("enc.pem");
    openssl(&[
        "pkey",
        "-in",
        s.key.to_str().unwrap(),
        "-aes256",
        "-passout",
        "pass:hunter2-pass",
        "-out",
        enc.to_str().unwrap(),
    ]);
    let cfg_enc = s.dir.write(
        "oci-config-enc",
        &format!("[DEFAULT]\nuser={USER}\nfingerprint={FINGERPRINT}\ntenancy={TENANCY}\nkey_file={}\npass_phrase=hunter2-pass\n", enc.display()),
    );
    let (snap, pol) = files(&s, json!({"config_file": cfg_enc}), "{}", 0.0);
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("is an encrypted PKCS#8 key; this release cannot decrypt keys"),
        "{err}"
    );
    assert!(err.contains("pass_phrase is set, but encrypted keys are not supported"));
    assert!(!err.contains("hunter2"));
    assert!(s.rx.requests().is_empty(), "a request was made");
}

// ---------------------------------------------------------------------------------------------
// instance_principal

const IP_TENANCY: &str = "ocid1.tenancy.oc1..aaaatest";
const KEY_MARKER: &str = "SECRET-KEY-MARKER-7f3a";

/// The base64 DER of the first certificate of a PEM file.
fn cert_b64(pem: &Path) -> String {
    let text = std::fs::read_to_string(pem).unwrap();
    let body = text
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .unwrap()
        .split("-----END CERTIFICATE-----")
        .next()
        .unwrap();
    body.split_whitespace().collect()
}

/// CA -> intermediate -> leaf, made with openssl. Returns (leaf.pem, leaf.key, intermediate.pem).
fn instance_chain(dir: &TempDir) -> (PathBuf, PathBuf, PathBuf) {
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let ext = dir.write(
        "ca.ext",
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
    );
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.pem"),
        "-subj",
        "/CN=svc test root CA",
        "-days",
        "2",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &p("int.key"),
        "-out",
        &p("int.csr"),
        "-subj",
        "/CN=svc test intermediate",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("int.csr"),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-out",
        &p("int.pem"),
        "-days",
        "2",
        "-extfile",
        ext.to_str().unwrap(),
    ]);
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &p("leaf.key"), "-out", &p("leaf.csr"), "-subj",
        &format!("/CN=ocid1.instance.oc1.eu-frankfurt-1.aaaainst/OU=opc-certtype:instance/OU=opc-compartment:ocid1.compartment.oc1..aaaacomp/OU=opc-instance:ocid1.instance.oc1.eu-frankfurt-1.aaaainst/OU=opc-tenant:{IP_TENANCY}")]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("leaf.csr"),
        "-CA",
        &p("int.pem"),
        "-CAkey",
        &p("int.key"),
        "-CAcreateserial",
        "-out",
        &p("leaf.pem"),
        "-days",
        "2",
    ]);
    // the chain is real: the leaf verifies against the root through the intermediate
    openssl(&[
        "verify",
        "-CAfile",
        &p("ca.pem"),
        "-untrusted",
        &p("int.pem"),
        &p("leaf.pem"),
    ]);
    openssl(&[
        "x509",
        "-in",
        &p("leaf.pem"),
        "-pubkey",
        "-noout",
        "-out",
        &p("leaf.pub.pem"),
    ]);
    (
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
        dir.join("int.pem"),
    )
}

fn leaf_fingerprint(leaf: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(leaf)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim().split_once('=').unwrap().1.to_string()
}

/// The fake metadata service: `Authorization: Bearer Oracle` required, GET only.
fn metadata_service(answers: Vec<(String, String)>) -> Receiver {
    Receiver::start(Box::new(move |r| {
        if r.method != "GET" || r.header("authorization") != Some("Bearer Oracle") {
            return (401, "missing Authorization: Bearer Oracle".into());
        }
        match answers.iter().find(|(path, _)| *path == r.target) {
            Some((_, body)) => (200, body.clone()),
            None => (404, "not found".into()),
        }
    }))
}

/// The strict federation check; on success writes the posted session public key as PEM.
fn validate_federation(
    r: &Received,
    host: &str,
    dir: &Path,
    leaf: &Path,
    intermediate: &Path,
) -> Result<(), String> {
    if r.method != "POST" || r.target != "/v1/x509" || r.header("host") != Some(host) {
        return Err(format!("unexpected {} {}", r.method, r.target));
    }
    if r.header("content-type") != Some("application/json")
        || r.header("content-length") != Some(&r.body.len().to_string())
        || r.header("x-content-sha256") != Some(&STANDARD.encode(Sha256::digest(&r.body)))
    {
        return Err("bad content-type, content-length or x-content-sha256".into());
    }
    let skew = parse_http_date(r.header("date").ok_or("no date")?)?;
    if skew.abs() > 300.0 {
        return Err("date skew".into());
    }
    let key_id = format!("{IP_TENANCY}/fed-x509-sha256/{}", leaf_fingerprint(leaf));
    // the SDKs' federation signature leaves out host
    verify_signature_of(
        r,
        &dir.join("leaf.pub.pem"),
        &dir.join("scratch"),
        &key_id,
        "date (request-target) content-length content-type x-content-sha256",
    )?;
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("not JSON: {e}"))?;
    keys_exactly(
        &v,
        "body",
        &[
            "certificate",
            "publicKey",
            "intermediateCertificates",
            "purpose",
            "fingerprintAlgorithm",
        ],
        &[],
    )?;
    if v["certificate"] != cert_b64(leaf)
        || v["intermediateCertificates"] != json!([cert_b64(intermediate)])
        || v["purpose"] != "DEFAULT"
        || v["fingerprintAlgorithm"] != "SHA256"
    {
        return Err("certificate, intermediates, purpose or fingerprintAlgorithm".into());
    }
    let der = STANDARD
        .decode(v["publicKey"].as_str().ok_or("publicKey")?)
        .map_err(|_| "publicKey is not base64")?;
    let der_path = dir.join("session.pub.der");
    std::fs::write(&der_path, der).unwrap();
    // a DER SubjectPublicKeyInfo of a 2048-bit RSA key, or openssl refuses it
    let out = Command::new("openssl")
        .args(["pkey", "-pubin", "-inform", "DER", "-text_pub", "-in"])
        .arg(&der_path)
        .arg("-out")
        .arg(dir.join("session.pub.pem.txt"))
        .output()
        .unwrap();
    let text = std::fs::read_to_string(dir.join("session.pub.pem.txt")).unwrap_or_default();
    if !out.status.success() || !text.contains("Public-Key: (2048 bit)") {
        return Err("publicKey is not a DER SubjectPublicKeyInfo of an RSA 2048 key".into());
    }
    openssl(&[
        "pkey",
        "-pubin",
        "-inform",
        "DER",
        "-in",
        der_path.to_str().unwrap(),
        "-out",
        dir.join("session.pub.pem").to_str().unwrap(),
    ]);
    Ok(())
}

struct Instance {
    dir: TempDir,
    metadata: Receiver,
    federation: Receiver,
    metrics: Receiver,
    token: String,
    leaf_key: String,
}

fn instance(tag: &str, federation_status: u16) -> Instance {
    let dir = TempDir::new(tag);
    std::fs::create_dir_all(dir.join("scratch")).unwrap();
    let (leaf, leaf_key, intermediate) = instance_chain(&dir);
    let leaf_key_pem = std::fs::read_to_string(&leaf_key).unwrap();
    let answers = vec![
        ("/opc/v2/instance/region".to_string(), "fra\n".to_string()),
        (
            "/opc/v2/identity/cert.pem".into(),
            std::fs::read_to_string(&leaf).unwrap(),
        ),
        // the marker stands for anything secret near the key: it must never be printed
        (
            "/opc/v2/identity/key.pem".into(),
            format!("{KEY_MARKER}\n{leaf_key_pem}"),
        ),
        (
            "/opc/v2/identity/intermediate.pem".into(),
            std::fs::read_to_string(&intermediate).unwrap(),
        ),
    ];
    let metadata = metadata_service(answers);
    let token = jwt(time::OffsetDateTime::now_utc().unix_timestamp() + 1200);
    let (t, d) = (token.clone(), dir.path().to_path_buf());
    let host = Arc::new(std::sync::OnceLock::<String>::new());
    let h = host.clone();
    let federation = Receiver::start(Box::new(move |r| {
        match validate_federation(
            r,
            h.get().unwrap(),
            &d,
            &d.join("leaf.pem"),
            &d.join("int.pem"),
        ) {
            Ok(()) if federation_status == 200 => (200, json!({"token": t}).to_string()),
            Ok(()) => (
                federation_status,
                json!({"code": "NotAuthenticated", "message": "the certificate is not trusted"})
                    .to_string(),
            ),
            Err(why) => (
                400,
                json!({"code": "InvalidParameter", "message": why}).to_string(),
            ),
        }
    }));
    host.set(federation.addr.to_string()).unwrap();
    let (t, d) = (token.clone(), dir.path().to_path_buf());
    let mhost = Arc::new(std::sync::OnceLock::<String>::new());
    let h = mhost.clone();
    let metrics = Receiver::start(Box::new(move |r| {
        match validate(
            r,
            h.get().unwrap(),
            &d.join("session.pub.pem"),
            &d.join("scratch"),
            &format!("ST${t}"),
            50,
        ) {
            Ok(()) => (
                200,
                r#"{"failedMetricsCount": 0, "failedMetrics": []}"#.into(),
            ),
            Err(reply) => reply,
        }
    }));
    mhost.set(metrics.addr.to_string()).unwrap();
    Instance {
        dir,
        metadata,
        federation,
        metrics,
        token,
        leaf_key: leaf_key_pem,
    }
}

fn instance_files(i: &Instance) -> (String, String) {
    let snap = i.dir.write(
        "snapshot.json",
        &snapshot(&[("orders.eu.>", "orders_eu")], 0.0),
    );
    let mut p: Value = serde_json::from_str(&policy("{}")).unwrap();
    // auth_mode left out: instance_principal is the default
    p["cloud_a_monitoring"] = json!({"enabled": true, "region": REGION, "compartment_id": COMPARTMENT,
                                     "max_metrics_per_request": 50, "timeout_seconds": 5});
    let pol = i.dir.write("policy.json", &p.to_string());
    (snap.to_str().unwrap().into(), pol.to_str().unwrap().into())
}

fn assert_no_secret(i: &Instance, o: &Output) {
    let text = format!("{}{}", stdout(o), stderr(o));
    let key_lines: Vec<&str> = i.leaf_key.lines().filter(|l| l.len() > 40).collect();
    assert!(key_lines.len() > 10);
    for secret in [KEY_MARKER, i.token.as_str(), IP_TENANCY, COMPARTMENT]
        .into_iter()
        .chain(key_lines)
    {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
}

#[test]
fn instance_principal_federates_and_signs_with_the_session_key() {
    let i = instance("clouda-ip", 200);
    let (snap, pol) = instance_files(&i);
    let (md, fed, url) = (i.metadata.url(), i.federation.url(), i.metrics.url());
    let env = [
        ("SVC_OCI_METADATA_OVERRIDE", md.as_str()),
        ("SVC_OCI_FEDERATION_OVERRIDE", fed.as_str()),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let v = run(&["validate-policy", &pol], &[]);
    assert_eq!((v.status.code(), stderr(&v).as_str()), (Some(0), ""));
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert!(
        out.status.success(),
        "{}\nfederation: {:?}",
        stderr(&out),
        i.federation
            .requests()
            .iter()
            .map(|r| String::from_utf8_lossy(&r.body).to_string())
            .collect::<Vec<_>>()
    );
    assert!(
        stdout(&out).starts_with("cloud-a-export: sent "),
        "{}",
        stdout(&out)
    );
    // four metadata reads, one federation, PostMetricData verified against the session key
    let targets: Vec<String> = i
        .metadata
        .requests()
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(
        targets,
        [
            "/opc/v2/instance/region",
            "/opc/v2/identity/cert.pem",
            "/opc/v2/identity/key.pem",
            "/opc/v2/identity/intermediate.pem"
        ]
    );
    assert_eq!(i.federation.requests().len(), 1);
    let posted = i.metrics.requests();
    // One request per max_metrics_per_request metrics (how many depends on the metric count),
    // each signed with the federated session token.
    assert!(!posted.is_empty());
    for p in &posted {
        assert!(p
            .header("authorization")
            .unwrap()
            .contains(&format!("keyId=\"ST${}\"", i.token)));
    }
    let first_key = std::fs::read(i.dir.join("session.pub.der")).unwrap();
    assert_no_secret(&i, &out);
    // the session key is not the leaf key, and each run makes its own (token fetched per run)
    let leaf_pub = std::fs::read_to_string(i.dir.join("leaf.pub.pem")).unwrap();
    assert_ne!(
        leaf_pub,
        std::fs::read_to_string(i.dir.join("session.pub.pem")).unwrap()
    );
    let dry = run(&["cloud-a-export", &snap, &pol, "--dry-run"], &env);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(stdout(&dry).contains("authorization: <redacted>"));
    assert_no_secret(&i, &dry);
    assert_eq!(i.federation.requests().len(), 2);
    assert_ne!(
        first_key,
        std::fs::read(i.dir.join("session.pub.der")).unwrap()
    );
    assert_eq!(
        i.metrics.requests().len(),
        posted.len(),
        "the dry run sent no metrics"
    );
}

#[test]
fn instance_principal_failures_name_the_step() {
    let i = instance("clouda-ip-fail", 401);
    let (snap, pol) = instance_files(&i);
    let (md, fed, url) = (i.metadata.url(), i.federation.url(), i.metrics.url());
    // federation refuses the certificate: exit 1, the answer's code and message, no secret
    let env = [
        ("SVC_OCI_METADATA_OVERRIDE", md.as_str()),
        ("SVC_OCI_FEDERATION_OVERRIDE", fed.as_str()),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("svc-observe cloud-a-export: cloud_a_monitoring: sent 0 of "),
        "{err}"
    );
    assert!(err.trim_end().ends_with("last failure: instance principal step 4 (federation service /v1/x509) refused the instance certificate: HTTP 401 (NotAuthenticated: the certificate is not trusted)"), "{err}");
    assert_eq!(
        i.federation.requests().len(),
        1,
        "the federation fake verified the request"
    );
    assert_no_secret(&i, &out);
    // metadata unreachable (a closed port): exit 1 naming step 1
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://127.0.0.1:{closed}");
    let env2 = [
        ("SVC_OCI_METADATA_OVERRIDE", dead.as_str()),
        ("SVC_OCI_FEDERATION_OVERRIDE", fed.as_str()),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env2);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("last failure: instance principal step 1 (instance metadata /opc/v2/instance/region) failed: "), "{}", stderr(&out));
    // a metadata service without the key: step 1 names the path
    let partial = metadata_service(vec![
        ("/opc/v2/instance/region".into(), "fra".into()),
        (
            "/opc/v2/identity/cert.pem".into(),
            std::fs::read_to_string(i.dir.join("leaf.pem")).unwrap(),
        ),
    ]);
    let pu = partial.url();
    let env3 = [
        ("SVC_OCI_METADATA_OVERRIDE", pu.as_str()),
        ("SVC_OCI_FEDERATION_OVERRIDE", fed.as_str()),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env3);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("instance principal step 1 (instance metadata /opc/v2/identity/key.pem) answered HTTP 404"), "{}", stderr(&out));
    // a key.pem answer that is not a usable key: named, never echoed
    let broken = metadata_service(vec![
        ("/opc/v2/instance/region".into(), "fra".into()),
        (
            "/opc/v2/identity/cert.pem".into(),
            std::fs::read_to_string(i.dir.join("leaf.pem")).unwrap(),
        ),
        (
            "/opc/v2/identity/key.pem".into(),
            format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
                STANDARD.encode(KEY_MARKER)
            ),
        ),
        (
            "/opc/v2/identity/intermediate.pem".into(),
            std::fs::read_to_string(i.dir.join("int.pem")).unwrap(),
        ),
    ]);
    let bu = broken.url();
    let env4 = [
        ("SVC_OCI_METADATA_OVERRIDE", bu.as_str()),
        ("SVC_OCI_FEDERATION_OVERRIDE", fed.as_str()),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env4);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("instance principal step 1 (instance metadata identity/key.pem): the leaf private key is not a usable RSA private key"), "{err}");
    assert!(
        !err.contains(&STANDARD.encode(KEY_MARKER)) && !err.contains(KEY_MARKER),
        "{err}"
    );
    // overrides are loopback-only test hooks
    let env5 = [
        ("SVC_OCI_METADATA_OVERRIDE", "http://169.254.169.254"),
        ("SVC_CLOUD_A_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    let out = run(&["cloud-a-export", &snap, &pol], &env5);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "svc-observe cloud-a-export: cloud_a_monitoring: SVC_OCI_METADATA_OVERRIDE must name a loopback host (it is a test hook for a local receiver)\n");
    assert!(
        i.metrics.requests().is_empty(),
        "no metrics without an identity"
    );
    assert_eq!(i.federation.requests().len(), 1);
}
