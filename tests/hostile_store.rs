//! Object stores and credential endpoints that misbehave on purpose, against the `svc` binary:
//! a decompression bomb served at a taken key (`fail_existing`), a store that ignores
//! `If-None-Match`, and peers that echo the request's secrets back in their error text.
//!
//! The fakes are `support::http::Receiver`s: each request parsed strictly and recorded, the answer
//! chosen by the test.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::broker::NatsServer;
use crate::support::http::{Received, Receiver};
use crate::support::process::Runner;
use crate::support::{snapshot_counter, write_config};
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";

const KEY_ID: &str = "AKIAHOSTILETEST12345";
const SECRET: &str = "hostile/Secret+Access/Key0123456789abcdef";
const TOKEN: &str = "IQoJb3JpZ2luX2VjEHostile/Session+Token/Value==";

fn credentials_env() -> HashMap<String, String> {
    HashMap::from([
        ("T_KEY_ID".to_string(), KEY_ID.to_string()),
        ("T_SECRET".to_string(), SECRET.to_string()),
        ("T_TOKEN".to_string(), TOKEN.to_string()),
    ])
}

fn sink_block(endpoint: &str, extra: Value) -> Value {
    let mut v = json!({
        "type": "object_store", "bucket": "hostile", "endpoint_url": endpoint,
        "allow_http_for_local_testing": true, "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
        "session_token_env": "T_TOKEN", "key_strategy": "stream_sequence",
        "max_retries": 0,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn config(server_url: &str, dir: &Path, sink: Value, logging: Value) -> PathBuf {
    let cfg = json!({
        "nats": {"url": server_url, "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10, "max_deliveries": 1,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": logging,
    });
    write_config(dir, "c.json", &cfg)
}

fn broker_with(n: usize) -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    server
}

fn start_runner(config: &Path, log: &Path, env: &HashMap<String, String>) -> Runner {
    Runner::start_env(config, log, env)
}

/// `svc test-sink` with exactly `env` (plus PATH): (exit code, stdout + stderr).
fn test_sink(config: &Path, env: &HashMap<String, String>) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("test-sink")
        .arg(config)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Polls `cond` until `limit`; on timeout fails with the runner's log.
fn wait_for_log(runner: &mut Runner, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end && runner.child.try_wait().unwrap().is_none() {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}; log:\n{}", runner.log_text());
}

/// The peak resident set (VmHWM) of a live process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

fn s3_error(code: &str, message: &str) -> Vec<u8> {
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>")
        .into_bytes()
}

/// gzip of `{"stream":"ORDERS","pad":"AAAA...` (`inflated` bytes of padding) that never
/// closes: a bomb that inflates about a thousand times.
fn gzip_bomb(inflated: usize) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(br#"{"stream":"ORDERS","pad":""#).unwrap();
    let chunk = vec![b'A'; 1 << 20];
    for _ in 0..inflated / chunk.len() {
        enc.write_all(&chunk).unwrap();
    }
    enc.finish().unwrap()
}

/// A store that answers every conditional PUT with 412 and every GET with a gzip bomb of
/// 256 MiB (about 256 KiB on the wire, under the GET's bound of `max_object_bytes`, 1 MiB).
/// The runner must refuse it in bounded memory and settle the message with the reason.
#[test]
fn a_gzip_bomb_at_a_taken_key_is_refused_in_bounded_memory() {
    let bomb = gzip_bomb(256 << 20);
    assert!(bomb.len() < 1 << 20, "bomb is {} bytes", bomb.len());
    let store = Receiver::start_raw(Box::new(move |r: &Received| match r.method.as_str() {
        "PUT" if r.header("if-none-match") == Some("*") => (
            412,
            "application/xml",
            s3_error(
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            ),
        ),
        "GET" => (200, "application/json", bomb.clone()),
        _ => (400, "text/plain", b"unexpected request".to_vec()),
    }));
    let server = broker_with(1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &server.url(),
        dir.path(),
        sink_block(
            &store.url(),
            json!({"duplicate_policy": "fail_existing", "compression": "gzip",
                   "object_suffix": ".json.gz", "max_object_bytes": 1048576}),
        ),
        json!({"level": "info"}),
    );
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"), &credentials_env());
    let snap = dir.path().join("metrics.json");
    wait_for_log(
        &mut runner,
        Duration::from_secs(60),
        "the message is terminated",
        || snapshot_counter(&snap, "messages_terminated_total") == 1,
    );
    let peak_kib = peak_rss_kib(runner.child.id());
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    eprintln!("peak RSS of svc run meeting the bomb: {} KiB", peak_kib);
    // Measured here: 18 MiB. Before the bound the sink inflated 64 x max_object_bytes into
    // memory and parsed it into a tree: 83 MiB peak with this bomb (1.1 GB with the default
    // max_object_bytes and a 65 KB bomb).
    assert!(peak_kib < 48 * 1024, "peak RSS {peak_kib} KiB");
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    let log = runner.log_text();
    assert!(
        log.contains(&format!(
            "put stream-sequence/ORDERS/{}/1.json.gz: key already exists and the stored object \
             is not an envelope of this message: its body decompresses to over 1048576 bytes \
             (duplicate_policy fail_existing)",
            server.incarnation("ORDERS")
        )),
        "{log}"
    );
    let gets = store
        .requests()
        .iter()
        .filter(|r| r.method == "GET")
        .count();
    assert_eq!(gets, 1, "one look at the stored object");
}

/// A store that accepts every PUT, `If-None-Match: *` on an existing key included (as s3rver
/// does). `svc test-sink` must call it unusable for the policies that rely on conditional
/// writes, and usable (with a note) for `replace`; an honest store passes.
#[test]
fn test_sink_refuses_a_store_that_ignores_conditional_writes() {
    let ignoring = Receiver::start_raw(Box::new(|r: &Received| match r.method.as_str() {
        "PUT" => (200, "application/xml", Vec::new()),
        "DELETE" => (204, "application/xml", Vec::new()),
        _ => (400, "text/plain", b"unexpected request".to_vec()),
    }));
    let stored = std::sync::Mutex::new(std::collections::HashSet::new());
    let honest = Receiver::start_raw(Box::new(move |r: &Received| {
        let mut stored = stored.lock().unwrap();
        match r.method.as_str() {
            "PUT" if r.header("if-none-match") == Some("*") && stored.contains(&r.target) => (
                412,
                "application/xml",
                s3_error("PreconditionFailed", "At least one of the pre-conditions"),
            ),
            "PUT" => {
                stored.insert(r.target.clone());
                (200, "application/xml", Vec::new())
            }
            "DELETE" => {
                stored.remove(&r.target);
                (204, "application/xml", Vec::new())
            }
            _ => (400, "text/plain", b"unexpected request".to_vec()),
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    // `svc test-sink` never contacts the broker: the URL only has to validate.
    let nats = "nats://127.0.0.1:4222";
    let check = |store: &Receiver, policy: &str| {
        let cfg = config(
            nats,
            dir.path(),
            sink_block(&store.url(), json!({"duplicate_policy": policy})),
            json!({"level": "info"}),
        );
        test_sink(&cfg, &credentials_env())
    };
    for policy in ["skip_existing", "fail_existing"] {
        let (code, out) = check(&ignoring, policy);
        assert_eq!(code, 1, "{policy}: {out}");
        assert!(out.contains("Sink object_store is NOT usable"), "{out}");
        assert!(
            out.contains("to a second conditional put (If-None-Match: *) of probe")
                && out.contains("it ignores conditional writes")
                && out.contains(&format!("duplicate_policy {policy} relies on them")),
            "{out}"
        );
    }
    let (code, out) = check(&ignoring, "replace");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("note: the store answered 200 to a second conditional put")
            && out.contains("which duplicate_policy replace does not rely on"),
        "{out}"
    );
    // Every probe was deleted again (three runs: three DELETEs, six PUTs).
    let methods: Vec<String> = ignoring.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods.iter().filter(|m| *m == "DELETE").count(), 3);
    assert_eq!(methods.iter().filter(|m| *m == "PUT").count(), 6);

    let (code, out) = check(&honest, "skip_existing");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("refuses to overwrite (probe object")
            && out.contains("a second conditional put refused with 412; deleted)"),
        "{out}"
    );
}

/// Every value the test must never see in output, and the forms a peer may echo it in.
fn forbidden(values: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for v in values {
        out.push(v.clone());
        out.push(v.replace('/', "\\/"));
        // The last characters cut off would still leave a long prefix.
        out.push(v[..v.len() - 1].to_string());
    }
    out
}

fn assert_clean(what: &str, text: &str, values: &[String]) {
    for line in text.lines() {
        for f in forbidden(values) {
            assert!(!line.contains(&f), "{what}: a secret ({f}) in: {line}");
        }
    }
}

/// The signatures of every recorded request.
fn signatures(store: &Receiver) -> Vec<String> {
    store
        .requests()
        .iter()
        .filter_map(|r| r.header("authorization").map(str::to_string))
        .filter_map(|a| a.split("Signature=").nth(1).map(str::to_string))
        .collect()
}

/// A store whose 403 error document quotes the request: its headers (session token,
/// Authorization with key id and signature) raw, JSON-escaped and percent-encoded. Neither
/// `svc test-sink` nor `svc run` (text and JSON logs) may print any of them.
#[test]
fn secrets_a_store_echoes_never_reach_the_output() {
    let store = Receiver::start_raw(Box::new(|r: &Received| {
        let token = r.header("x-amz-security-token").unwrap_or_default();
        let auth = r.header("authorization").unwrap_or_default();
        let message = format!(
            "denied: token={token} json={} url={} Authorization: {auth}",
            token.replace('/', "\\/"),
            token
                .replace('/', "%2F")
                .replace('+', "%2B")
                .replace('=', "%3D"),
        );
        let code = auth.split("Signature=").nth(1).unwrap_or("x");
        (403, "application/xml", s3_error(code, &message))
    }));
    let dir = tempfile::tempdir().unwrap();
    let server = broker_with(2);
    let secrets = |store: &Receiver| {
        let mut v = vec![KEY_ID.to_string(), SECRET.to_string(), TOKEN.to_string()];
        v.extend(signatures(store));
        v
    };

    let cfg = config(
        &server.url(),
        dir.path(),
        sink_block(&store.url(), json!({})),
        json!({"level": "info"}),
    );
    let (code, out) = test_sink(&cfg, &credentials_env());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("status 403"), "{out}");
    assert!(out.contains("denied: token=<redacted>"), "{out}");
    assert_clean("svc test-sink", &out, &secrets(&store));

    for format in ["text", "json"] {
        let cfg = config(
            &server.url(),
            dir.path(),
            sink_block(&store.url(), json!({})),
            json!({"level": "info", "format": format}),
        );
        let log = dir.path().join(format!("run-{format}.log"));
        let mut runner = start_runner(&cfg, &log, &credentials_env());
        wait_for_log(&mut runner, Duration::from_secs(30), "a failed put", || {
            runner_log(&log).contains("denied: token=<redacted>")
        });
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(20));
        let text = runner.log_text();
        assert!(text.contains("status 403"), "{text}");
        assert_clean(&format!("svc run ({format} logs)"), &text, &secrets(&store));
    }
}

fn runner_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A container credentials endpoint that answers 403 quoting the Authorization header it got
/// (`AWS_CONTAINER_AUTHORIZATION_TOKEN`'s value), raw and JSON-escaped.
#[test]
fn a_container_endpoint_echoing_its_token_is_scrubbed() {
    const CONTAINER_TOKEN: &str = "container/Auth+Token=hostile-0123456789";
    let endpoint = Receiver::start_raw(Box::new(|r: &Received| {
        let auth = r.header("authorization").unwrap_or_default();
        let body = format!(
            r#"{{"code": "AccessDenied", "message": "bad Authorization header {auth} ({})"}}"#,
            auth.replace('/', "\\/")
        );
        (403, "application/json", body.into_bytes())
    }));
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // `svc test-sink` never contacts the broker (nor, here, the store: the chain fails first).
    let cfg = config(
        "nats://127.0.0.1:4222",
        dir.path(),
        json!({"type": "object_store", "bucket": "hostile",
               "endpoint_url": "http://127.0.0.1:9", "allow_http_for_local_testing": true}),
        json!({"level": "info"}),
    );
    let env = HashMap::from([
        ("HOME".to_string(), home.path().display().to_string()),
        ("AWS_EC2_METADATA_DISABLED".to_string(), "true".to_string()),
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI".to_string(),
            format!("{}/v2/credentials", endpoint.url()),
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN".to_string(),
            CONTAINER_TOKEN.to_string(),
        ),
    ]);
    let (code, out) = test_sink(&cfg, &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("HTTP 403"), "{out}");
    assert!(out.contains("bad Authorization header <redacted>"), "{out}");
    assert_eq!(
        endpoint.requests()[0].header("authorization"),
        Some(CONTAINER_TOKEN),
        "the endpoint got the token"
    );
    assert_clean("svc test-sink", &out, &[CONTAINER_TOKEN.to_string()]);
}

/// A store whose listing answers "truncated" forever with no key (a new token each time):
/// `svc verify-custody --public-key` ends with an error naming the listing, in bounded time.
#[test]
fn an_endless_empty_truncated_listing_ends_the_audit() {
    let store = Receiver::start_raw(Box::new(|r: &Received| match r.method.as_str() {
        "GET" => {
            let n = r.target.len();
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult>\
                 <IsTruncated>true</IsTruncated><NextContinuationToken>t{n}</NextContinuationToken>\
                 </ListBucketResult>"
            );
            (200, "application/xml", xml.into_bytes())
        }
        _ => (400, "text/plain", b"unexpected request".to_vec()),
    }));
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        "nats://127.0.0.1:4222",
        dir.path(),
        sink_block(&store.url(), json!({})),
        json!({"level": "info"}),
    );
    let public = dir.path().join("cp.pub");
    std::fs::write(&public, "GK2Qx6HwLpGF2I7B4bzu1mr0A8NLUO/zNdJ7x8ZdMdU=").unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["verify-custody", cfg.to_str().unwrap(), "--public-key"])
        .arg(format!("cp1={}", public.display()))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(credentials_env())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("pages in a row with no key, still \"truncated\""),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let gets = store.requests().len();
    assert!((9..=10).contains(&gets), "{gets} listing requests");
}
