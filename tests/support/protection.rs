//! Shared harness of the payload-protection tests: the Python helper (an independent
//! implementation of the documented formats), keys, configs, signed publishing.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde_json::{json, Value};

use super::broker::NatsServer;
use super::files_below;
use super::process::{svc_run, Runner};
pub use super::python::python;
use super::python::script;

pub const STREAM: &str = "ORDERS";
pub const CONSUMER: &str = "svc";
pub const DLQ_SUBJECT: &str = "svc.dlq.orders";
pub const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Publisher keys: the HMAC secret and the Ed25519 seed of the documented test vectors.
pub const HMAC_SECRET: [u8; 32] = [0x0b; 32];
pub const ED_SEED: [u8; 32] = [0x01; 32];
pub const AES_K1: [u8; 32] = [0x11; 32];
pub const AES_K2: [u8; 32] = [0x22; 32];
pub const CUSTODY_KEY: [u8; 32] = [0x33; 32];

/// One request to the Python helper.
pub fn py(req: &Value) -> Value {
    let helper = script("protection_helper.py");
    let mut child = Command::new(python())
        .arg(helper)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python with cryptography (source scripts/deps.sh; deps_test)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(req).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A publisher's signature, made by Python.
pub fn py_sign(
    alg: &str,
    key: &[u8],
    message_id: Option<&str>,
    payload: &[u8],
    subject: &str,
) -> String {
    let ans = py(&json!({"op": "sign", "items": [{
        "alg": alg, "key_b64": B64.encode(key), "message_id": message_id,
        "payload_b64": B64.encode(payload), "subject": subject}]}));
    ans["signatures"][0].as_str().unwrap().to_string()
}

pub fn ed_public_key() -> String {
    let ans = py(&json!({"op": "sign", "items": [{
        "alg": "ed25519", "key_b64": B64.encode(ED_SEED), "message_id": null,
        "payload_b64": "", "subject": "x"}]}));
    ans["public_keys"][0].as_str().unwrap().to_string()
}

pub fn write_private(dir: &Path, name: &str, key: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, B64.encode(key)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The environment of every `svc` process of these tests (secrets by variable only).
pub fn secrets_env() -> HashMap<String, String> {
    HashMap::from([
        ("PP_HMAC_SECRET".to_string(), B64.encode(HMAC_SECRET)),
        ("PP_CUSTODY_KEY".to_string(), B64.encode(CUSTODY_KEY)),
    ])
}

pub fn start_runner(config: &Path, log: &Path) -> Runner {
    start_runner_env(config, log, &HashMap::new())
}

/// [`start_runner`] with more variables (a sink's credentials).
pub fn start_runner_env(config: &Path, log: &Path, extra: &HashMap<String, String>) -> Runner {
    Runner::spawn(svc_run(config).envs(secrets_env()).envs(extra), log)
}

/// `svc <args>` with the secrets in the environment: (exit code, stdout, stderr).
pub fn svc_env(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(args)
        .envs(secrets_env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = child.stdin.take().unwrap();
    if let Some(data) = stdin {
        let mut input = input;
        input.write_all(data).unwrap();
    } else {
        drop(input);
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The three protection blocks; `keys` = (id, file) of the encryption keys.
pub fn protection_blocks(keys: &[(&str, &Path)], active: &str, ed_pub: &str) -> Value {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(id, p)| json!({"key_id": id, "key_file": p}))
        .collect();
    json!({
        "payload_encryption": {
            "enabled": true, "keys": keys, "active_key_id": active, "digest_key_id": "k1",
            "rules": [{"subject": "orders.public.>", "action": "clear"}], "default": "encrypt"
        },
        "authenticity": {
            "enabled": true,
            "keys": [{"key_id": "h1", "secret_env": "PP_HMAC_SECRET"},
                     {"key_id": "ed1", "public_key_b64": ed_pub}],
            "rules": [{"subject": "orders.ed.>", "required": true, "algorithms": ["ed25519"]},
                      {"subject": "orders.pii.>", "required": true}]
        },
        "custody": {"enabled": true, "runner_id": "runner-test-1", "hmac_key_env": "PP_CUSTODY_KEY"},
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                        "include_headers": ["Content-Type"], "publish_timeout_ms": 2000}
    })
}

pub fn config(server: &NatsServer, dir: &Path, sink: Value, blocks: Value) -> Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": "orders.>"},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    for (k, v) in blocks.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    cfg
}

/// A message to publish: subject, payload, headers.
pub struct Msg {
    pub subject: &'static str,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

pub fn signed(subject: &'static str, payload: &[u8], id: &str, alg: &str, key_id: &str) -> Msg {
    let key: &[u8] = if alg == "hmac-sha256" {
        &HMAC_SECRET
    } else {
        &ED_SEED
    };
    let sig = py_sign(alg, key, Some(id), payload, subject);
    Msg {
        subject,
        payload: payload.to_vec(),
        headers: vec![
            ("Nats-Msg-Id".into(), id.into()),
            ("Svc-Signature-Alg".into(), alg.into()),
            ("Svc-Signature-Key-Id".into(), key_id.into()),
            ("Svc-Signature".into(), sig),
        ],
    }
}

pub fn publish(server: &NatsServer, msgs: &[Msg]) {
    for m in msgs {
        let h: Vec<(&str, &str)> = m
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        server.publish_with_headers(m.subject, &h, &m.payload);
    }
}

/// Stream sequence -> (path, stored per-event file record); custody checkpoints (cut while
/// the runner runs, e.g. within a second of a gap) are not records.
pub fn records(out: &Path) -> BTreeMap<u64, (PathBuf, Value)> {
    files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| !p.starts_with(".svc-checkpoints"))
        .map(|p| {
            let path = out.join(&p);
            let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            (v["stream_sequence"].as_u64().unwrap(), (path, v))
        })
        .collect()
}

/// Each stored record written to `<dir>/<stream sequence>.json`, for `svc decrypt` and
/// `svc verify-custody`; the paths in sequence order.
pub fn write_record_files(dir: &Path, stored: &BTreeMap<u64, Value>) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    stored
        .iter()
        .map(|(seq, v)| {
            let p = dir.join(format!("{seq}.json"));
            std::fs::write(&p, v.to_string()).unwrap();
            p.display().to_string()
        })
        .collect()
}

pub fn dlq_records(server: &NatsServer) -> Vec<(String, Value)> {
    let js = server.js();
    (1..=server.stream_messages("DLQ"))
        .map(|seq| {
            let m = js.get_message("DLQ", seq).unwrap();
            (
                String::from_utf8(m.data.clone()).unwrap(),
                serde_json::from_slice(&m.data).unwrap(),
            )
        })
        .collect()
}

/// Python opens every encrypted record: (seq -> (key id, plaintext)), checking the AAD swap
/// and the keyed digest of each.
pub fn python_open(
    recs: &[&Value],
    keys: &[(&str, &[u8])],
    raw: &BTreeMap<u64, Vec<u8>>,
) -> BTreeMap<u64, (String, String)> {
    let keys: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(id, k)| (id.to_string(), json!(B64.encode(k))))
        .collect();
    let raw: serde_json::Map<String, Value> = raw
        .iter()
        .map(|(s, d)| (s.to_string(), json!(B64.encode(d))))
        .collect();
    let ans = py(&json!({"op": "open", "keys": keys, "digest_key_id": "k1",
                         "records": recs, "raw_payloads": raw}));
    ans["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let seq = r["seq"].as_u64().unwrap();
            assert_eq!(
                r["swap_refused"], true,
                "seq {seq}: a moved ciphertext decrypted"
            );
            assert_eq!(
                r["digest_ok"], true,
                "seq {seq}: payload_info.sha256 is not the documented keyed digest"
            );
            (
                seq,
                (
                    r["key_id"].as_str().unwrap().to_string(),
                    r["plaintext"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}
