//! Payload protection end to end (issue 14): a real nats-server (JetStream), the `svc`
//! binary, and an independent implementation of the documented formats in Python
//! (`tests/support/protection_helper.py`, `cryptography`): Python signs what publishers send and
//! decrypts what the sinks store; `svc decrypt` and `svc verify-custody` work on the files.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::protection::*;
use crate::support::*;
use base64::Engine as _;
use serde_json::{json, Value};

#[test]
fn file_sink_encrypts_verifies_signatures_and_seals_custody() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let k2 = write_private(dir.path(), "k2.key", &AES_K2);
    let ed_pub = ed_public_key();
    let out = dir.path().join("out");
    let sink = json!({"type": "file", "directory": out});
    let cfg1 = write_config(
        dir.path(),
        "c1.json",
        &config(
            &server,
            dir.path(),
            sink.clone(),
            protection_blocks(&[("k1", &k1)], "k1", &ed_pub),
        ),
    );
    let (code, _, err) = svc_env(&["validate", cfg1.to_str().unwrap()], None);
    assert_eq!(code, 0, "{err}");

    let bad_sig = py_sign(
        "ed25519",
        &ED_SEED,
        Some("m7"),
        b"{\"other\":1}",
        "orders.pii.f",
    );
    let mut msgs = vec![
        signed(
            "orders.pii.a",
            b"{\"card\": \"4111-PLAINTEXT-1\"}",
            "m1",
            "ed25519",
            "ed1",
        ),
        signed(
            "orders.pii.b",
            b"PLAINTEXT-2 text",
            "m2",
            "hmac-sha256",
            "h1",
        ),
        Msg {
            subject: "orders.public.x",
            payload: b"{\"public\":3}".to_vec(),
            headers: vec![],
        },
        Msg {
            subject: "orders.pii.c",
            payload: b"{\"PLAINTEXT\":4}".to_vec(),
            headers: vec![],
        },
        signed(
            "orders.pii.d",
            b"{\"PLAINTEXT\":5}",
            "m5",
            "hmac-sha256",
            "nobody",
        ),
        signed(
            "orders.ed.e",
            b"{\"PLAINTEXT\":6}",
            "m6",
            "hmac-sha256",
            "h1",
        ),
        signed("orders.pii.f", b"{\"PLAINTEXT\":7}", "m7", "ed25519", "ed1"),
        Msg {
            subject: "orders.pii.g",
            payload: b"{\"PLAINTEXT\":8}".to_vec(),
            headers: vec![("Svc-Signature".into(), bad_sig.clone())],
        },
        signed("orders.ed.h", &[0xff, 0x00, 0x01], "m9", "ed25519", "ed1"),
    ];
    // Seq 7 carries a valid signature of another payload.
    msgs[6].headers[3].1 = bad_sig.clone();
    publish(&server, &msgs);
    let raw: BTreeMap<u64, Vec<u8>> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| (i as u64 + 1, m.payload.clone()))
        .collect();

    let mut runner = start_runner(&cfg1, &dir.path().join("svc1.log"));
    wait_until(Duration::from_secs(60), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((9, 0, 0))
    });
    runner.signal("TERM");
    assert!(
        runner.wait_timeout(Duration::from_secs(30)).is_some(),
        "{}",
        runner.log_text()
    );

    // Each authenticity failure was dead-lettered with its reason, never the signature,
    // the key or the payload; encrypted subjects carry only the keyed digest.
    let dlq = dlq_records(&server);
    let reasons: BTreeMap<u64, String> = dlq
        .iter()
        .map(|(text, v)| {
            assert!(
                !text.contains("PLAINTEXT") && !text.contains(&bad_sig),
                "{text}"
            );
            assert_eq!(v["failure"]["stage"], "authenticity", "{text}");
            assert!(v["payload"].get("sha256").is_none(), "{text}");
            assert_eq!(
                v["payload"]["hmac_sha256"].as_str().unwrap().len(),
                64,
                "{text}"
            );
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                v["failure"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expect: BTreeMap<u64, String> = [
        (4, "missing_signature"),
        (5, "unknown_key"),
        (6, "disallowed_algorithm"),
        (7, "bad_signature"),
        (8, "malformed_signature"),
    ]
    .into_iter()
    .map(|(s, r)| (s, r.to_string()))
    .collect();
    assert_eq!(reasons, expect);

    // What landed: the signed (and the unsigned public) messages, none in clear but seq 3.
    let stored = records(&out);
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 9]);
    for (path, _) in stored.values() {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(!text.contains("PLAINTEXT"), "{text}");
    }
    assert_eq!(stored[&3].1["payload"], json!({"public": 3}));
    assert_eq!(
        stored[&3].1["payload_info"]["sha256"],
        util_sha256(b"{\"public\":3}")
    );
    for (_, v) in stored.values() {
        assert_eq!(v["custody"]["schema"], "svc.custody.v1");
        assert_eq!(v["custody"]["alg"], "hmac-sha256");
        assert_eq!(v["custody"]["runner_id"], "runner-test-1");
    }

    // Python decrypts from the documented format; the AAD binds each to its place.
    let enc: Vec<&Value> = [1, 2, 9].iter().map(|s| &stored[s].1).collect();
    let opened = python_open(&enc, &[("k1", &AES_K1)], &raw);
    assert_eq!(
        opened[&1],
        ("k1".into(), r#"{"card":"4111-PLAINTEXT-1"}"#.into())
    );
    assert_eq!(
        opened[&2],
        ("k1".into(), r#"{"text":"PLAINTEXT-2 text"}"#.into())
    );
    assert_eq!(opened[&9], ("k1".into(), r#"{"base64":"/wAB"}"#.into()));

    // svc decrypt: a file, and standard input; a record moved to another place is refused.
    let c1 = cfg1.to_str().unwrap();
    let (code, stdout, err) = svc_env(&["decrypt", c1, stored[&1].0.to_str().unwrap()], None);
    assert_eq!(
        (code, stdout.as_str()),
        (0, "{\"card\":\"4111-PLAINTEXT-1\"}\n"),
        "{err}"
    );
    let mut moved = stored[&2].1.clone();
    moved["stream_sequence"] = json!(1);
    let (code, stdout, err) = svc_env(&["decrypt", c1, "-"], Some(moved.to_string().as_bytes()));
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(err.contains("decryption failed"), "{err}");

    // Custody: every record intact; a tampered one is reported, exit 1.
    let files: Vec<String> = stored
        .values()
        .map(|(p, _)| p.display().to_string())
        .collect();
    let mut args = vec!["verify-custody", c1];
    args.extend(files.iter().map(String::as_str));
    let (code, stdout, err) = svc_env(&args, None);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.ends_with("4 intact, 0 altered, 0 unverifiable\n"),
        "{stdout}"
    );
    let mut tampered = stored[&3].1.clone();
    tampered["payload"]["public"] = json!(4);
    std::fs::write(&stored[&3].0, tampered.to_string()).unwrap();
    let (code, stdout, _) = svc_env(&args, None);
    assert_eq!(code, 1, "{stdout}");
    let altered: Vec<&str> = stdout.lines().filter(|l| l.ends_with("ALTERED")).collect();
    assert_eq!(altered.len(), 1, "{stdout}");
    assert!(
        altered[0].contains(&stored[&3].0.display().to_string()),
        "{stdout}"
    );

    // Metrics of each feature in the final snapshot.
    let snap = dir.path().join("metrics.json");
    for (name, want) in [
        ("authenticity_verified_total", 3),
        ("authenticity_unsigned_total", 1),
        ("authenticity_missing_signature_total", 1),
        ("authenticity_unknown_key_total", 1),
        ("authenticity_disallowed_algorithm_total", 1),
        ("authenticity_bad_signature_total", 1),
        ("authenticity_malformed_signature_total", 1),
        ("payload_encrypted_total", 3),
        ("payload_encryption_clear_total", 1),
        ("custody_sealed_total", 4),
        ("messages_dlq_total", 5),
    ] {
        assert_eq!(snapshot_counter(&snap, name), want, "{name}");
    }
    // No key material in the logs.
    let log = runner.log_text();
    for secret in [
        B64.encode(AES_K1),
        B64.encode(HMAC_SECRET),
        B64.encode(CUSTODY_KEY),
    ] {
        assert!(!log.contains(&secret));
    }

    // Rotation: k2 active, k1 decrypt-only (and still the digest key).
    let cfg2 = write_config(
        dir.path(),
        "c2.json",
        &config(
            &server,
            dir.path(),
            sink,
            protection_blocks(&[("k1", &k1), ("k2", &k2)], "k2", &ed_pub),
        ),
    );
    publish(
        &server,
        &[signed(
            "orders.pii.z",
            b"{\"n\":\"PLAINTEXT-10\"}",
            "m10",
            "hmac-sha256",
            "h1",
        )],
    );
    let mut raw = raw;
    raw.insert(10, b"{\"n\":\"PLAINTEXT-10\"}".to_vec());
    let mut runner = start_runner(&cfg2, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(60), "the new message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((10, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let stored = records(&out);
    assert_eq!(stored[&10].1["payload"]["key_id"], "k2");
    let enc: Vec<&Value> = [1, 2, 9, 10].iter().map(|s| &stored[s].1).collect();
    let opened = python_open(&enc, &[("k1", &AES_K1), ("k2", &AES_K2)], &raw);
    assert_eq!(opened[&1].0, "k1");
    assert_eq!(opened[&10], ("k2".into(), r#"{"n":"PLAINTEXT-10"}"#.into()));
    let c2 = cfg2.to_str().unwrap();
    for (seq, want) in [
        (1, "{\"card\":\"4111-PLAINTEXT-1\"}\n"),
        (10, "{\"n\":\"PLAINTEXT-10\"}\n"),
    ] {
        let (code, stdout, err) = svc_env(&["decrypt", c2, stored[&seq].0.to_str().unwrap()], None);
        assert_eq!((code, stdout.as_str()), (0, want), "{err}");
    }
    // The old configuration (k1 only) cannot read the new record.
    let (code, _, err) = svc_env(&["decrypt", c1, stored[&10].0.to_str().unwrap()], None);
    assert_eq!(code, 1);
    assert!(err.contains("key id k2"), "{err}");
}

fn util_sha256(data: &[u8]) -> String {
    svc::message::envelope::hex_sha256(data)
}

/// The test vectors of docs/payload-protection.md, recomputed by Python from the documented
/// rules, and present verbatim in the docs.
#[test]
fn published_test_vectors_match_an_independent_signer() {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/payload-protection.md"),
    )
    .unwrap();
    let data = br#"{"order":42}"#;
    let hmac = py_sign(
        "hmac-sha256",
        &HMAC_SECRET,
        Some("order-42"),
        data,
        "orders.created",
    );
    let ed = py_sign(
        "ed25519",
        &ED_SEED,
        Some("order-42"),
        data,
        "orders.created",
    );
    let signed = format!(
        r#"{{"message_id":"order-42","payload_sha256":"{}","subject":"orders.created"}}"#,
        util_sha256(data)
    );
    for want in [hmac.as_str(), ed.as_str(), &ed_public_key(), &signed] {
        assert!(
            docs.contains(want),
            "docs/payload-protection.md lacks {want}"
        );
    }
}

/// Keys are refused at start when a key file is readable by others, with no key echoed, and
/// invalid blocks name every field at validate time.
#[test]
fn bad_keys_and_configs_are_refused_without_echo() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    std::fs::set_permissions(&k1, std::fs::Permissions::from_mode(0o644)).unwrap();
    let sink = json!({"type": "file", "directory": dir.path().join("out")});
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            sink.clone(),
            protection_blocks(&[("k1", &k1)], "k1", &ed_public_key()),
        ),
    );
    let mut runner = start_runner(&cfg, &dir.path().join("svc.log"));
    let status = runner.wait_timeout(Duration::from_secs(30)).expect("exits");
    assert_eq!(status.code(), Some(1));
    let log = runner.log_text();
    assert!(
        log.contains("key k1") && log.contains("group or others"),
        "{log}"
    );
    assert!(!log.contains(&B64.encode(AES_K1)));

    let mut blocks = protection_blocks(&[("k1", &k1)], "nope", "short");
    blocks["custody"]["hmac_key_env"] = Value::Null;
    let mut bad = config(&server, dir.path(), sink, blocks);
    bad["sink"]["key_strategy"] = json!("payload_sha256");
    let cfg = write_config(dir.path(), "bad.json", &bad);
    let (code, _, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    for want in [
        "payload_encryption.active_key_id",
        "authenticity.keys[1].public_key_b64",
        "custody.hmac_key_env: is required when payload_encryption is enabled",
        "sink.key_strategy: payload_sha256 is refused",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

/// A key at its message bound: the records beyond it are neither stored nor dead-lettered but
/// left unacknowledged (NAKed, redelivered) and counted, until the operator rotates the key.
#[test]
fn records_beyond_the_key_bound_stay_unacknowledged_until_rotation() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let k2 = write_private(dir.path(), "k2.key", &AES_K2);
    let ed_pub = ed_public_key();
    let out = dir.path().join("out");
    let sink = json!({"type": "file", "directory": out});
    let mut blocks = protection_blocks(&[("k1", &k1)], "k1", &ed_pub);
    blocks["payload_encryption"]["max_messages_per_key"] = json!(2);
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), sink.clone(), blocks),
    );
    let msgs: Vec<Msg> = (1..=3)
        .map(|i| {
            let payload = format!("{{\"n\":{i}}}");
            signed(
                "orders.pii.k",
                payload.as_bytes(),
                &format!("b{i}"),
                "hmac-sha256",
                "h1",
            )
        })
        .collect();
    publish(&server, &msgs);
    let mut runner = start_runner(&cfg, &dir.path().join("svc.log"));
    let snap = dir.path().join("metrics.json");
    wait_until(
        Duration::from_secs(60),
        "the third record refused at least twice",
        || snapshot_counter(&snap, "payload_encryption_refused_total") >= 2,
    );
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert_eq!(
        records(&out).keys().copied().collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(server.stream_messages("DLQ"), 0, "never dead-lettered");
    let (floor, pending, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(floor, 2, "the third is not acknowledged");
    assert!(pending <= 1);
    assert!(
        runner.log_text().contains("rotate active_key_id"),
        "{}",
        runner.log_text()
    );

    // Rotated: the third is stored under the new key.
    let cfg2 = write_config(
        dir.path(),
        "c2.json",
        &config(
            &server,
            dir.path(),
            sink,
            protection_blocks(&[("k1", &k1), ("k2", &k2)], "k2", &ed_pub),
        ),
    );
    let mut runner = start_runner(&cfg2, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(60), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((3, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert_eq!(records(&out)[&3].1["payload"]["key_id"], "k2");
}
