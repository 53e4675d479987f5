//! The governance stages end to end (`docs/governance.md`): mission metadata, the pre-sink
//! policy and the size policy, against a real `nats-server -js`, the `svc` binary, and a
//! fan-out to the three stores (file, the local PostgreSQL, moto's S3). Every passing record
//! is stored with its mission metadata in each sink and its custody verifies; every failing
//! one is dead-lettered with its stage, field and reason (sizes with the measured size and the
//! limit), and no record, log line or snapshot holds the offending value or the payload.

mod cases;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::moto;
use crate::support::postgres::TestDb;
use crate::support::process::*;
use crate::support::protection::{
    dlq_records, py, records, start_runner_env, svc_env, write_private, write_record_files, AES_K1,
    CONSUMER, DLQ_SUBJECT, STREAM,
};
use crate::support::*;
use cases::{body, cases, governance_blocks, sortie, HEADER, MARK};
use serde_json::{json, Value};

fn s3_sink(m: &moto::Moto, bucket: &str) -> Value {
    json!({
        "type": "object_store", "bucket": bucket, "endpoint_url": m.endpoint(),
        "allow_http_for_local_testing": true, "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
        "key_strategy": "stream_sequence",
    })
}

/// Object-store objects by stream sequence.
fn s3_objects(m: &moto::Moto, bucket: &str) -> BTreeMap<u64, Value> {
    let ans = py(
        &json!({"op": "s3_objects", "endpoint": m.endpoint(), "key_id": m.key_id,
                         "secret": m.secret, "bucket": bucket}),
    );
    ans["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let v: Value = serde_json::from_str(o["body"].as_str().unwrap()).unwrap();
            (v["stream_sequence"].as_u64().unwrap(), v)
        })
        .collect()
}

/// `svc verify-custody` over records written to files: every one intact.
fn assert_intact(config: &str, dir: &Path, tag: &str, stored: &BTreeMap<u64, Value>) {
    let files = write_record_files(&dir.join(format!("verify-{tag}")), stored);
    let mut args = vec!["verify-custody", config];
    args.extend(files.iter().map(String::as_str));
    let (code, stdout, err) = svc_env(&args, None);
    assert_eq!(code, 0, "{tag}: {stdout}{err}");
    assert!(
        stdout.ends_with(&format!(
            "{} intact, 0 altered, 0 unverifiable\n",
            stored.len()
        )),
        "{tag}: {stdout}"
    );
}

/// Every rule and limit of the three stages through one runner into a fan-out of the three
/// stores: the passing records stored with their mission metadata in each, the failing ones
/// dead-lettered (then ACKed) with their reasons and no content.
#[test]
fn every_rule_and_limit_stores_or_dead_letters_in_every_sink() {
    let m = moto::Moto::start();
    m.create_bucket("gov", false);
    let db = TestDb::new("gov");
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let key = write_private(dir.path(), "k1.key", &AES_K1);
    let sink = json!({
        "type": "fanout",
        "sinks": {"files": {"type": "file", "directory": dir.path().join("out")},
                  "db": db.sink(json!({"auto_create_tables": true})),
                  "store": s3_sink(&m, "gov")},
        "routing": {"enabled": true,
                    "target_sink_types": {"files": "file", "db": "relational_db",
                                          "store": "object_store"},
                    "routes": [{"name": "all", "match": {"subject": ">"},
                                "targets": ["files", "db", "store"]}]}
    });
    let cfg = protection::config(&server, dir.path(), sink, governance_blocks(&key));
    let cfg_path = write_config(dir.path(), "c.json", &cfg);
    let c = cfg_path.to_str().unwrap();

    let cases = cases();
    let mut expected = BTreeMap::new();
    for (i, case) in cases.iter().enumerate() {
        let h: Vec<(&str, &str)> = case
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        server.publish_with_headers(case.subject, &h, &case.payload);
        expected.insert(i as u64 + 1, &case.expect);
    }
    // The header twice: only the raw protocol can send it.
    server.raw_publish(
        b"orders.ok.dup",
        &[
            (HEADER.as_bytes(), sortie("a", 1).as_bytes()),
            (HEADER.as_bytes(), sortie(MARK, 1).as_bytes()),
        ],
        &body(),
    );
    let dup = Err(("mission_metadata", "duplicate_header"));
    expected.insert(cases.len() as u64 + 1, &dup);
    let total = expected.len() as u64;

    let mut runner = start_runner_env(&cfg_path, &dir.path().join("svc.log"), &m.env());
    wait_until(Duration::from_secs(90), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((total, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(30))
        .expect("exits")
        .success());

    // The DLQ: exactly the failing ones, each with its stage, field and reason, no content.
    let dlq = dlq_records(&server);
    let failing: BTreeMap<u64, (&str, &str)> = expected
        .iter()
        .filter_map(|(seq, e)| e.as_ref().err().map(|f| (*seq, *f)))
        .collect();
    assert_eq!(dlq.len(), failing.len());
    let mut stages = BTreeMap::<String, u64>::new();
    let mut reasons = BTreeMap::<String, u64>::new();
    for (text, v) in &dlq {
        assert!(!text.contains(MARK), "offending value or payload in {text}");
        assert!(!text.contains("plantedlabel"), "labels in {text}");
        let seq = v["original"]["stream_sequence"].as_u64().unwrap();
        let (field, reason) = failing[&seq];
        assert_eq!(v["failure"]["reason"], reason, "{text}");
        assert_eq!(v["failure"]["field"], field, "{text}");
        let stage = v["failure"]["stage"].as_str().unwrap().to_string();
        *stages.entry(stage.clone()).or_default() += 1;
        *reasons
            .entry(format!("{stage}_{reason}_total"))
            .or_default() += 1;
        if stage == "size_policy" || reason == "policy_payload_too_large" || reason == "too_large" {
            let size = &v["failure"]["size"];
            assert!(
                size["measured"].as_u64().unwrap() > size["limit"].as_u64().unwrap(),
                "{text}"
            );
        }
    }
    assert_eq!(stages["mission_metadata"], 15);
    assert_eq!(stages["pre_sink_policy"], 8);
    assert_eq!(stages["size_policy"], 9);

    // Every sink holds exactly the passing ones, each with its mission metadata.
    let passing: BTreeMap<u64, &Value> = expected
        .iter()
        .filter_map(|(seq, e)| e.as_ref().ok().map(|m| (*seq, m)))
        .collect();
    let files: BTreeMap<u64, Value> = records(&dir.path().join("out"))
        .into_iter()
        .map(|(seq, (_, v))| (seq, v))
        .collect();
    let objects = s3_objects(&m, "gov");
    let rows = db.events_by_sequence();
    for (tag, stored, member) in [
        ("file", &files, "mission_metadata"),
        ("object store", &objects, "mission_metadata"),
        ("relational", &rows, "mission_metadata_json"),
    ] {
        assert_eq!(
            stored.keys().collect::<Vec<_>>(),
            passing.keys().collect::<Vec<_>>(),
            "{tag}"
        );
        for (seq, want) in &passing {
            let got = stored[seq].get(member).cloned().unwrap_or(Value::Null);
            assert_eq!(&&got, want, "{tag}: sequence {seq}");
            assert!(!stored[seq].to_string().contains(MARK), "{tag}");
        }
        assert_intact(c, dir.path(), tag, stored);
    }
    // The file record holds the canonical text (keys sorted, no whitespace).
    let line = std::fs::read_to_string(
        files_below(&dir.path().join("out"))
            .into_iter()
            .map(|p| dir.path().join("out").join(p))
            .find(|p| std::fs::read_to_string(p).unwrap().contains("\"s-1\""))
            .unwrap(),
    )
    .unwrap();
    assert!(
        line.contains(r#""mission_metadata":{"profile":"sortie.v1","sortie_id":"s-1","wave":3}"#),
        "{line}"
    );

    // `svc inspect` shows each message's verdict: the same, but for the record-bytes bound
    // (it needs the encrypted, sealed record, which only the runner makes).
    let last = total.to_string();
    let (code, out, err) = svc_env(&["inspect", c, "--last", &last, "--format", "jsonl"], None);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, total);
    for line in &lines {
        let seq = line["stream_sequence"].as_u64().unwrap();
        let g = &line["governance"];
        match expected[&seq] {
            Ok(mission) => {
                assert_eq!(g["verdict"], "stored", "{line}");
                assert_eq!(&g["mission_metadata"], mission, "{line}");
            }
            Err((_, "record_too_large")) => assert_eq!(g["verdict"], "stored", "{line}"),
            Err((field, reason)) => {
                assert_eq!(g["verdict"], "refused", "{line}");
                assert_eq!(
                    (g["field"].as_str(), g["reason"].as_str()),
                    (Some(*field), Some(*reason))
                );
            }
        }
    }
    let (_, text, _) = svc_env(&["inspect", c, "--last", &last], None);
    assert!(
        text.contains("governance=refused size_policy/payload_too_large (payload)"),
        "{text}"
    );
    assert!(
        text.contains("governance=stored mission={\"profile\":\"sortie.v1\""),
        "{text}"
    );

    let snap = dir.path().join("metrics.json");
    let n = |name: &str| snapshot_counter(&snap, name);
    assert_eq!(n("mission_metadata_rejected_total"), 15);
    assert_eq!(n("pre_sink_policy_rejected_total"), 8);
    assert_eq!(n("size_policy_rejected_total"), 9);
    assert_eq!(
        n("mission_metadata_attached_total"),
        passing.len() as u64 - 1
    );
    assert_eq!(n("messages_dlq_total"), failing.len() as u64);
    // Each reason has its own counter.
    for (counter, count) in &reasons {
        assert_eq!(n(counter), *count, "{counter}");
    }
    assert_eq!(reasons.len(), 31, "{reasons:?}");
    assert_eq!(n("messages_acked_total"), total);
    let log = runner.log_text();
    assert!(!log.contains(MARK), "offending value in the log");
    assert!(!std::fs::read_to_string(&snap).unwrap().contains(MARK));
}

/// `svc validate` reports every bad rule, profile and limit of the three blocks, each with
/// its field path, in one run.
#[test]
fn validate_names_every_bad_rule_profile_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": dir.path().join("out")},
        "mission_metadata": {
            "enabled": true, "header": "bad header", "max_bytes": 0,
            "profiles": {"p": {"required_fields": {"a": {"type": "float"}},
                               "optional_fields": {"b": {"type": "string", "min": 1}}}},
            "allowed_profiles": ["nope"],
            "default": {"profile": "p", "a": 1},
            "rules": [{"subject": "o..x", "metadata": {}}]
        },
        "pre_sink_policy": {"enabled": true, "unmatched_subject": "sometimes",
                            "rules": [{"subject": "o.>", "require_priority": []},
                                      {"subject": "o.x", "when": "priority == 'high'"}]},
        "size_policy": {"enabled": true, "max_payload_bytes": 0, "max_record_bytes": "big"}
    });
    let path = write_config(dir.path(), "bad.json", &cfg);
    let (code, out, err) = svc(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    let text = format!("{out}{err}");
    for want in [
        "mission_metadata.header: ",
        "mission_metadata.max_bytes: must be an integer from 1 to 262144",
        "mission_metadata.profiles.p.required_fields.a.type: is required",
        "mission_metadata.profiles.p.optional_fields.b.min: does not apply to type string",
        "mission_metadata.allowed_profiles[0]: names no profile",
        "mission_metadata.rules[0].subject: ",
        "pre_sink_policy.unmatched_subject: must be one of: reject, allow",
        "pre_sink_policy.rules[0].require_priority: must list at least one value",
        "pre_sink_policy.rules[1].when: unknown field",
        "pre_sink_policy.rules[1].subject: the rule requires nothing",
        "size_policy.max_payload_bytes: must be an integer from 1 to 1073741824",
        "size_policy.max_record_bytes: must be an integer from 1 to 1073741824",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    let enabled_alone = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": dir.path().join("out")},
        "pre_sink_policy": {"enabled": true},
        "size_policy": {"enabled": true}
    });
    let path = write_config(dir.path(), "alone.json", &enabled_alone);
    let (code, out, err) = svc(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    let text = format!("{out}{err}");
    assert!(
        text.contains("pre_sink_policy.rules: must hold at least one rule"),
        "{text}"
    );
    assert!(
        text.contains("size_policy.enabled: is true but no limit is set"),
        "{text}"
    );
}
