//! Object-store sink against a real S3-compatible server (moto, signature checking enforced),
//! calling `write_batch` and `check` directly. End-to-end runner tests live in
//! `tests/object_store_e2e.rs`.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::support::moto::{Moto, OutageProxy};
use crate::support::TempDir;
use serde_json::{json, Value};
use svc::config::RuntimeConfig;
use svc::message::envelope::{normalize, Envelope, EnvelopeConfig, RawMessage};
use svc::metrics::Metrics;
use svc::sink::object_store::config::ObjectStoreConfig;
use svc::sink::object_store::ObjectStoreSink;
use svc::sink::{Sink, SinkConfig, WriteOutcome};

/// One moto for the tests that do not stop it; each test uses its own bucket.
fn shared() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(Moto::start)
}

fn parse_config(sink: Value) -> ObjectStoreConfig {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": sink,
    });
    match RuntimeConfig::parse(&doc.to_string())
        .expect("valid config")
        .sink
    {
        SinkConfig::ObjectStore(c) => *c,
        other => panic!("{other:?}"),
    }
}

/// Sink block for `bucket` at `endpoint` with credentials from `T_KEY_ID`/`T_SECRET`, with
/// `extra` fields merged in.
fn block(endpoint: &str, bucket: &str, extra: Value) -> Value {
    let mut v = json!({
        "type": "object_store",
        "bucket": bucket,
        "endpoint_url": endpoint,
        "allow_http_for_local_testing": true,
        "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID",
        "secret_access_key_env": "T_SECRET",
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn sink_at(
    m: &Moto,
    endpoint: &str,
    bucket: &str,
    extra: Value,
    metrics: Arc<Metrics>,
) -> ObjectStoreSink {
    ObjectStoreSink::with_env(
        parse_config(block(endpoint, bucket, extra)),
        metrics,
        &m.env(),
    )
    .expect("build sink")
}

fn sink(m: &Moto, bucket: &str, extra: Value) -> ObjectStoreSink {
    sink_at(
        m,
        &m.endpoint(),
        bucket,
        extra,
        Arc::new(Metrics::default()),
    )
}

fn envelope(
    seq: u64,
    subject: &str,
    msg_id: Option<&str>,
    data: &[u8],
    received: i128,
) -> Envelope {
    let mut headers = vec![];
    if let Some(id) = msg_id {
        headers.push(("Nats-Msg-Id".to_string(), id.to_string()));
    }
    normalize(
        &RawMessage {
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers,
            ..RawMessage::sample(subject, seq, data)
        },
        received,
        &EnvelopeConfig::default(),
    )
    .0
}

fn env1(seq: u64) -> Envelope {
    envelope(
        seq,
        "orders.created",
        Some(&format!("id-{seq}")),
        format!(r#"{{"order": {seq}}}"#).as_bytes(),
        1_700_000_001_000_000_000,
    )
}

fn get(s: &ObjectStoreSink, key: &str) -> Option<svc::sink::object_store::client::Reply> {
    s.client().get_object(key, 1 << 24).expect("get")
}

fn json_of(s: &ObjectStoreSink, key: &str) -> Value {
    let reply = get(s, key).unwrap_or_else(|| panic!("object {key} missing"));
    serde_json::from_slice(&reply.body).unwrap()
}

fn assert_all(outcomes: &[WriteOutcome], want: WriteOutcome) {
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(o, &want, "outcome {i}");
    }
}

#[test]
fn each_key_strategy_writes_its_key_shape() {
    let m = shared();
    m.create_bucket("t-keys", false);
    let e = envelope(
        42,
        "orders.créé",
        Some("msg/../7"),
        br#"{"a": 1}"#,
        1_700_000_001_000_000_000,
    );
    let digest = e.payload_info.sha256.clone();
    for (strategy, key) in [
        (
            "idempotency_key",
            "svc/p/idempotency-key/s-ORDERS-42.json".to_string(),
        ),
        (
            "stream_sequence",
            "svc/p/stream-sequence/ORDERS/42.json".to_string(),
        ),
        (
            "message_id",
            "svc/p/message-id/msg~2F..~2F7.json".to_string(),
        ),
        (
            "payload_sha256",
            format!("svc/p/payload-sha256/orders.cr~C3~A9~C3~A9/{digest}.json"),
        ),
    ] {
        let s = sink(
            m,
            "t-keys",
            json!({"key_strategy": strategy, "prefix": "svc", "key_prefix": "p"}),
        );
        assert_eq!(
            s.write_batch(std::slice::from_ref(&e)),
            vec![WriteOutcome::Durable]
        );
        let doc = json_of(&s, &key);
        assert_eq!(doc["stream_sequence"], 42, "{strategy}");
    }
    // message_id without a message ID, and a key over max_key_bytes: permanent, no request.
    let s = sink(m, "t-keys", json!({"key_strategy": "message_id"}));
    let out = s.write_batch(&[envelope(1, "a", None, b"{}", 0)]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.message.contains("needs a Nats-Msg-Id")),
        "{out:?}"
    );
    let s = sink(
        m,
        "t-keys",
        json!({"key_strategy": "message_id", "max_key_bytes": 64}),
    );
    let long = "x".repeat(80);
    let out = s.write_batch(&[envelope(1, "a", Some(&long), b"{}", 0)]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.message.contains("over max_key_bytes (64)")),
        "{out:?}"
    );
    assert!(get(&s, &format!("message-id/{long}.json")).is_none());
}

#[test]
fn envelope_document_has_every_field() {
    let m = shared();
    m.create_bucket("t-doc", false);
    let s = sink(m, "t-doc", json!({"key_strategy": "stream_sequence"}));
    let e = env1(7);
    assert_eq!(
        s.write_batch(std::slice::from_ref(&e)),
        vec![WriteOutcome::Durable]
    );
    let reply = get(&s, "stream-sequence/ORDERS/7.json").unwrap();
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let doc: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(doc.as_object().unwrap().len(), 18);
    // Field order as in the spec table (first occurrence of each top-level name).
    let text = String::from_utf8(reply.body.clone()).unwrap();
    let order: Vec<usize> = [
        "schema",
        "schema_version",
        "subject",
        "stream",
        "stream_sequence",
        "consumer",
        "consumer_sequence",
        "message_id",
        "priority",
        "classification",
        "labels",
        "labels_list",
        "payload",
        "payload_info",
        "mission_metadata",
        "security_labels",
        "custody",
        "metadata",
    ]
    .iter()
    .map(|k| {
        text.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} missing"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?} in {text}");
    assert_eq!(doc["schema"], "svc.objectstore.object.v1");
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["subject"], "orders.created");
    assert_eq!(doc["message_id"], "id-7");
    assert_eq!(doc["payload"], json!({"order": 7}));
    assert_eq!(doc["payload_info"]["sha256"], e.payload_info.sha256);
    assert_eq!(doc["payload_info"]["original_format"], "json");
    assert_eq!(doc["mission_metadata"], Value::Null);
    assert_eq!(doc["custody"], Value::Null);
    assert_eq!(doc["metadata"]["schema"], "svc.metadata.v1");
}

#[test]
fn payload_format_stores_only_the_payload() {
    let m = shared();
    m.create_bucket("t-payload", false);
    let s = sink(
        m,
        "t-payload",
        json!({"key_strategy": "stream_sequence", "object_format": "payload"}),
    );
    let text = envelope(2, "a.b", None, b"plain text", 0);
    assert_all(&s.write_batch(&[env1(1), text]), WriteOutcome::Durable);
    assert_eq!(
        get(&s, "stream-sequence/ORDERS/1.json").unwrap().body,
        br#"{"order":1}"#
    );
    assert_eq!(
        json_of(&s, "stream-sequence/ORDERS/2.json"),
        json!({"text": "plain text"})
    );
}

#[test]
fn skip_existing_sends_if_none_match_and_treats_412_as_prior_success() {
    let m = shared();
    m.create_bucket("t-skip", true);
    let s = sink(m, "t-skip", json!({"key_strategy": "stream_sequence"}));
    let first = env1(1);
    assert_eq!(s.write_batch(&[first]), vec![WriteOutcome::Durable]);
    let before = get(&s, "stream-sequence/ORDERS/1.json").unwrap().body;
    // Redelivery: same key, different receive time (different bytes).
    let mut again = env1(1);
    again.metadata.received_at =
        svc::text::rfc3339::Rfc3339::from_unix_nanos(1_893_456_000_000_000_000);
    again.metadata.delivery_count = 2;
    assert_eq!(s.write_batch(&[again]), vec![WriteOutcome::AlreadyDurable]);
    assert_eq!(
        get(&s, "stream-sequence/ORDERS/1.json").unwrap().body,
        before
    );
    assert_eq!(
        m.versions("t-skip").get("stream-sequence/ORDERS/1.json"),
        Some(&1)
    );
}

/// A publisher who first sends a victim's future `Nats-Msg-Id` with its own content: with
/// `message_id` keys and `skip_existing`, the victim's message is no longer taken as already
/// durable (acknowledged with the attacker's content stored) but refused for good, while a
/// publisher's retry of the same payload under the same id still counts as durable.
#[test]
fn skip_existing_takes_a_taken_key_only_for_the_same_message() {
    let m = shared();
    m.create_bucket("t-skip-id", true);
    let s = sink(m, "t-skip-id", json!({"key_strategy": "message_id"}));
    let at = 1_700_000_001_000_000_000;
    let attacker = envelope(
        1,
        "orders.created",
        Some("victim-1"),
        br#"{"order":666}"#,
        at,
    );
    assert_eq!(s.write_batch(&[attacker]), vec![WriteOutcome::Durable]);
    let victim = envelope(
        2,
        "orders.created",
        Some("victim-1"),
        br#"{"order":42}"#,
        at,
    );
    match &s.write_batch(&[victim])[..] {
        [WriteOutcome::Permanent(e)] => {
            let text = e.to_string();
            assert!(text.contains("holds another message"), "{text}");
            assert!(text.contains("duplicate_policy skip_existing"), "{text}");
            assert!(!text.contains("666") && !text.contains("42"), "{text}");
        }
        other => panic!("the victim's message counted as written: {other:?}"),
    }
    let retry = envelope(
        3,
        "orders.created",
        Some("victim-1"),
        br#"{"order":666}"#,
        at,
    );
    assert_eq!(s.write_batch(&[retry]), vec![WriteOutcome::AlreadyDurable]);
    assert_eq!(
        m.versions("t-skip-id").get("message-id/victim-1.json"),
        Some(&1)
    );
}

#[test]
fn replace_overwrites_without_condition() {
    let m = shared();
    m.create_bucket("t-replace", true);
    let s = sink(
        m,
        "t-replace",
        json!({"key_strategy": "stream_sequence", "duplicate_policy": "replace"}),
    );
    assert_eq!(s.write_batch(&[env1(1)]), vec![WriteOutcome::Durable]);
    let mut again = env1(1);
    again.metadata.delivery_count = 9;
    assert_eq!(s.write_batch(&[again]), vec![WriteOutcome::Durable]);
    assert_eq!(
        json_of(&s, "stream-sequence/ORDERS/1.json")["metadata"]["delivery_count"],
        9
    );
    assert_eq!(
        m.versions("t-replace").get("stream-sequence/ORDERS/1.json"),
        Some(&2)
    );
}

#[test]
fn fail_existing_is_permanent_for_a_different_object_at_the_key() {
    let m = shared();
    m.create_bucket("t-fail", true);
    let s = sink(
        m,
        "t-fail",
        json!({"key_strategy": "message_id", "duplicate_policy": "fail_existing"}),
    );
    let a = envelope(1, "a.b", Some("dup"), br#"{"v": 1}"#, 0);
    assert_eq!(
        s.write_batch(std::slice::from_ref(&a)),
        vec![WriteOutcome::Durable]
    );
    // The same message redelivered (the first answer was lost): already durable.
    let mut redelivered = a.clone();
    redelivered.metadata.delivery_count = 2;
    assert_eq!(
        s.write_batch(&[redelivered]),
        vec![WriteOutcome::AlreadyDurable]
    );
    // Another message reusing the publisher ID: the 412 is a permanent duplicate error.
    let b = envelope(2, "a.b", Some("dup"), br#"{"v": 2}"#, 0);
    let out = s.write_batch(std::slice::from_ref(&b));
    match &out[0] {
        WriteOutcome::Permanent(e) => assert_eq!(
            e.to_string(),
            "sink object_store: put message-id/dup.json: key already exists and the stored \
             object holds another message (duplicate_policy fail_existing)"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        json_of(&s, "message-id/dup.json")["payload"],
        json!({"v": 1})
    );
    assert_eq!(m.versions("t-fail").get("message-id/dup.json"), Some(&1));
    // skip_existing on the same collision: another payload under the id is not this
    // message's copy either (it used to count as prior success).
    let skip = sink(m, "t-fail", json!({"key_strategy": "message_id"}));
    match &skip.write_batch(&[b])[..] {
        [WriteOutcome::Permanent(e)] => assert!(
            e.to_string().ends_with("(duplicate_policy skip_existing)"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fail_existing_recognises_its_own_gzip_object() {
    let m = shared();
    m.create_bucket("t-fail-gz", false);
    let s = sink(
        m,
        "t-fail-gz",
        json!({"key_strategy": "stream_sequence", "duplicate_policy": "fail_existing",
               "compression": "gzip", "object_suffix": ".json.gz"}),
    );
    assert_eq!(s.write_batch(&[env1(1)]), vec![WriteOutcome::Durable]);
    let mut again = env1(1);
    again.metadata.delivery_count = 3;
    assert_eq!(s.write_batch(&[again]), vec![WriteOutcome::AlreadyDurable]);
    // Same key, different payload (a stream re-created from scratch): permanent.
    let other = envelope(1, "orders.created", None, br#"{"other": true}"#, 0);
    assert!(matches!(
        &s.write_batch(&[other])[0],
        WriteOutcome::Permanent(e) if e.message.contains("key already exists")
    ));
}

#[test]
fn every_credential_mode_signs_accepted_requests() {
    let m = shared();
    m.create_bucket("t-creds", false);
    let dir = TempDir::new("creds");
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n\n\
             [svc-writer]\naws_access_key_id={id}\naws_secret_access_key={secret}\n",
            id = m.key_id,
            secret = m.secret
        ),
    )
    .unwrap();
    let files = |extra: &[(&str, &str)]| -> HashMap<String, String> {
        let mut e = HashMap::from([
            (
                "AWS_SHARED_CREDENTIALS_FILE".to_string(),
                creds.display().to_string(),
            ),
            (
                "AWS_CONFIG_FILE".to_string(),
                dir.path().join("none").display().to_string(),
            ),
        ]);
        for (k, v) in extra {
            e.insert(k.to_string(), v.to_string());
        }
        e
    };
    let build = |mode: Value, env: &HashMap<String, String>| {
        let mut b = block(&m.endpoint(), "t-creds", json!({}));
        for k in [
            "credential_mode",
            "access_key_id_env",
            "secret_access_key_env",
        ] {
            b.as_object_mut().unwrap().remove(k);
        }
        for (k, v) in mode.as_object().unwrap() {
            b[k] = v.clone();
        }
        ObjectStoreSink::with_env(parse_config(b), Arc::new(Metrics::default()), env).unwrap()
    };
    // default_chain from the environment variables.
    let env = HashMap::from([
        ("AWS_ACCESS_KEY_ID".to_string(), m.key_id.clone()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), m.secret.clone()),
    ]);
    let verdict = build(json!({}), &env).check().unwrap();
    assert!(
        verdict.contains("credentials from environment variables AWS_ACCESS_KEY_ID"),
        "{verdict}"
    );
    // default_chain from the shared credentials file.
    let verdict = build(json!({}), &files(&[])).check().unwrap();
    assert!(
        verdict.contains("credentials from profile default of"),
        "{verdict}"
    );
    // profile mode.
    let verdict = build(
        json!({"credential_mode": "profile", "profile_name": "svc-writer"}),
        &files(&[]),
    )
    .check()
    .unwrap();
    assert!(
        verdict.contains("credentials from profile svc-writer of"),
        "{verdict}"
    );
    assert!(!verdict.contains(&m.secret) && !verdict.contains(&m.key_id));
}

#[test]
fn sidecar_is_written_and_recovered_on_redelivery() {
    let m = shared();
    m.create_bucket("t-sidecar", false);
    let s = sink(
        m,
        "t-sidecar",
        json!({"key_strategy": "stream_sequence", "metadata_mode": "sidecar",
               "object_metadata": {"team": "ops"}}),
    );
    let e = env1(5);
    assert_eq!(
        s.write_batch(std::slice::from_ref(&e)),
        vec![WriteOutcome::Durable]
    );
    let primary = "stream-sequence/ORDERS/5.json";
    let sidecar_key = "stream-sequence/ORDERS/5.json.metadata.json";
    let reply = get(&s, primary).unwrap();
    assert!(
        !reply
            .headers
            .iter()
            .any(|(k, _)| k.starts_with("x-amz-meta-")),
        "sidecar mode sends no object metadata: {:?}",
        reply.headers
    );
    let side = json_of(&s, sidecar_key);
    assert_eq!(side["schema"], "svc.objectstore.sidecar.v1");
    assert_eq!(side["object_key"], primary);
    assert_eq!(side["payload_info"]["sha256"], e.payload_info.sha256);
    assert_eq!(side["stream_sequence"], 5);
    assert_eq!(side["object_metadata"], json!({"team": "ops"}));
    assert!(side.get("payload").is_none(), "never the payload body");
    let raw = String::from_utf8(get(&s, sidecar_key).unwrap().body).unwrap();
    assert!(!raw.contains("\"order\""), "{raw}");

    // The sidecar goes missing (a crash between the two puts): redelivery writes it.
    s.client().delete_object(sidecar_key).unwrap();
    assert!(get(&s, sidecar_key).is_none());
    let mut again = env1(5);
    again.metadata.delivery_count = 2;
    assert_eq!(s.write_batch(&[again]), vec![WriteOutcome::AlreadyDurable]);
    assert_eq!(json_of(&s, sidecar_key)["metadata"]["delivery_count"], 2);
    // Both present: still prior success, nothing rewritten.
    assert_eq!(
        s.write_batch(&[env1(5)]),
        vec![WriteOutcome::AlreadyDurable]
    );
    assert_eq!(json_of(&s, sidecar_key)["metadata"]["delivery_count"], 2);
}

#[test]
fn gzip_objects_read_back_and_decompress() {
    let m = shared();
    m.create_bucket("t-gzip", false);
    let s = sink(
        m,
        "t-gzip",
        json!({"key_strategy": "stream_sequence", "compression": "gzip",
               "object_suffix": ".json.gz"}),
    );
    let e = env1(3);
    assert_eq!(s.write_batch(&[e]), vec![WriteOutcome::Durable]);
    let reply = get(&s, "stream-sequence/ORDERS/3.json.gz").unwrap();
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(&reply.body[..2], &[0x1f, 0x8b], "gzip magic");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&reply.body[..])
        .read_to_string(&mut text)
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["schema"], "svc.objectstore.object.v1");
    assert_eq!(doc["payload"], json!({"order": 3}));
}

#[test]
fn sse_content_type_and_metadata_read_back() {
    let m = shared();
    m.create_bucket("t-sse", false);
    let s = sink(
        m,
        "t-sse",
        json!({"key_strategy": "stream_sequence", "server_side_encryption": "AES256",
               "object_metadata": {"Team": "ops", "source-system": "erp"}}),
    );
    let e = env1(9);
    assert_eq!(
        s.write_batch(std::slice::from_ref(&e)),
        vec![WriteOutcome::Durable]
    );
    let head = s
        .client()
        .head_object("stream-sequence/ORDERS/9.json")
        .unwrap()
        .expect("object exists");
    assert_eq!(head.header("x-amz-server-side-encryption"), Some("AES256"));
    assert_eq!(head.header("content-type"), Some("application/json"));
    assert_eq!(head.header("x-amz-meta-team"), Some("ops"));
    assert_eq!(head.header("x-amz-meta-source-system"), Some("erp"));
    assert_eq!(
        head.header("x-amz-meta-svc-payload-sha256"),
        Some(e.payload_info.sha256.as_str())
    );
    assert_eq!(head.header("x-amz-meta-svc-stream-sequence"), Some("9"));
}

#[test]
fn limits_are_enforced_before_the_call() {
    let m = shared();
    m.create_bucket("t-limits", false);
    let s = sink(
        m,
        "t-limits",
        json!({"key_strategy": "stream_sequence", "max_object_bytes": 200}),
    );
    let big = envelope(1, "a", None, &vec![b'x'; 300], 0);
    let out = s.write_batch(&[big, env1(2)]);
    match &out[0] {
        WriteOutcome::Permanent(e) => {
            assert!(e.message.contains("over max_object_bytes (200)"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(get(&s, "stream-sequence/ORDERS/1.json").is_none());
    // The second one fails too (an envelope document is larger than 200 bytes)...
    assert!(matches!(out[1], WriteOutcome::Permanent(_)));
    // ...but a payload-format object of the same message fits.
    let p = sink(
        m,
        "t-limits",
        json!({"key_strategy": "stream_sequence", "max_object_bytes": 200,
               "object_format": "payload"}),
    );
    assert_eq!(p.write_batch(&[env1(2)]), vec![WriteOutcome::Durable]);
}

/// Eight racing writers of one key: exactly one `Durable`, seven `AlreadyDurable`, one version.
/// What this proves is the sink's side: it sends `If-None-Match: *` and reads a 412 as "already
/// durable". The single winner itself is decided by the test's own moto middleware
/// (`AtomicConditionalPut` in tests/support/moto_helper.py), not by moto: moto 5.2 checks the condition
/// and stores the object in separate steps, so without the middleware several writers can win.
/// Real S3 guarantees one winner; the middleware stands in for that guarantee.
#[test]
fn eight_racing_writers_of_one_key_one_winner_by_the_test_middleware() {
    let m = shared();
    m.create_bucket("t-race", true);
    for round in 0..3u64 {
        let sinks: Vec<ObjectStoreSink> = (0..8)
            .map(|_| {
                sink(
                    m,
                    "t-race",
                    json!({"key_strategy": "stream_sequence", "max_retries": 3,
                                              "retry_backoff_ms": 10}),
                )
            })
            .collect();
        let barrier = std::sync::Barrier::new(8);
        let outcomes: Vec<WriteOutcome> = std::thread::scope(|sc| {
            let handles: Vec<_> = sinks
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let barrier = &barrier;
                    std::thread::Builder::new()
                        .name(format!("writer-{i}"))
                        .spawn_scoped(sc, move || {
                            let mut e = env1(100 + round);
                            e.metadata.delivery_count = i as u64 + 1;
                            barrier.wait();
                            s.write_batch(&[e]).remove(0)
                        })
                        .unwrap()
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let durable = outcomes
            .iter()
            .filter(|o| **o == WriteOutcome::Durable)
            .count();
        let already = outcomes
            .iter()
            .filter(|o| **o == WriteOutcome::AlreadyDurable)
            .count();
        assert_eq!((durable, already), (1, 7), "{outcomes:?}");
        let key = format!("stream-sequence/ORDERS/{}.json", 100 + round);
        assert_eq!(m.versions("t-race").get(&key), Some(&1), "{key}");
    }
}

#[test]
fn batch_puts_run_concurrently_and_keep_order() {
    let m = shared();
    m.create_bucket("t-batch", false);
    let s = sink(
        m,
        "t-batch",
        json!({"key_strategy": "message_id", "max_concurrent_puts": 8}),
    );
    let mut batch: Vec<Envelope> = (1..=40).map(env1).collect();
    batch[17] = envelope(18, "a", None, b"{}", 0); // no message ID: permanent
    let out = s.write_batch(&batch);
    assert_eq!(out.len(), 40);
    for (i, o) in out.iter().enumerate() {
        if i == 17 {
            assert!(matches!(o, WriteOutcome::Permanent(_)), "{o:?}");
        } else {
            assert_eq!(o, &WriteOutcome::Durable, "{i}");
            assert_eq!(
                json_of(&s, &format!("message-id/id-{}.json", i + 1))["stream_sequence"],
                i as u64 + 1
            );
        }
    }
}

#[test]
fn store_stopped_mid_run_gives_transient_outcomes_and_retries() {
    let m = Moto::start();
    m.create_bucket("t-outage", true);
    let proxy = OutageProxy::start(m.port);
    let metrics = Arc::new(Metrics::default());
    let s = sink_at(
        &m,
        &proxy.endpoint(),
        "t-outage",
        json!({"key_strategy": "stream_sequence", "max_retries": 2, "retry_backoff_ms": 20,
               "retry_jitter": "none", "request_timeout_seconds": 2}),
        metrics.clone(),
    );
    assert_all(
        &s.write_batch(&(1..=5).map(env1).collect::<Vec<_>>()),
        WriteOutcome::Durable,
    );

    // Connection refused: every outcome transient, none durable, retries counted.
    proxy.take_down();
    let out = s.write_batch(&(6..=10).map(env1).collect::<Vec<_>>());
    for o in &out {
        assert!(
            matches!(o, WriteOutcome::Transient(e) if e.message.contains("destination unavailable")),
            "{o:?}"
        );
    }
    assert_eq!(
        metrics
            .counters
            .sink_retries_total
            .load(std::sync::atomic::Ordering::Relaxed),
        10
    );

    // The store hangs (process stopped): timeouts, transient.
    proxy.bring_up();
    m.pause();
    let started = Instant::now();
    let out = s.write_batch(&(6..=7).map(env1).collect::<Vec<_>>());
    m.resume();
    for o in &out {
        assert!(
            matches!(o, WriteOutcome::Transient(e) if e.message.contains("timeout")),
            "{o:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(30));

    // Back: redelivery writes the same keys, each exactly once.
    let out = s.write_batch(&(1..=10).map(env1).collect::<Vec<_>>());
    for o in &out {
        assert!(o.is_durable(), "{o:?}");
    }
    let versions = m.versions("t-outage");
    for seq in 1..=10 {
        assert_eq!(
            versions.get(&format!("stream-sequence/ORDERS/{seq}.json")),
            Some(&1),
            "{seq}"
        );
    }
}

#[test]
fn sustained_load_reuses_connections() {
    let m = shared();
    assert!(
        m.keep_alive,
        "moto must be served with keep-alive: install waitress next to moto (pip install waitress)"
    );
    m.create_bucket("t-reuse", false);
    let proxy = OutageProxy::start(m.port);
    let s = sink_at(
        m,
        &proxy.endpoint(),
        "t-reuse",
        json!({"key_strategy": "stream_sequence", "max_concurrent_puts": 8}),
        Arc::new(Metrics::default()),
    );
    let n = 600u64;
    for chunk in (1..=n).collect::<Vec<_>>().chunks(100) {
        let batch: Vec<Envelope> = chunk.iter().map(|s| env1(*s)).collect();
        assert_all(&s.write_batch(&batch), WriteOutcome::Durable);
    }
    let accepted = proxy.accepted.load(std::sync::atomic::Ordering::SeqCst);
    // One connection per put thread (a few more if the server closed an idle one), never one
    // per object.
    assert!(accepted <= 12, "{accepted} connections for {n} objects");
}

#[test]
fn wrong_secret_is_a_clear_failure() {
    let m = shared();
    m.create_bucket("t-auth", false);
    let mut env = m.env();
    env.insert("T_SECRET".into(), "not-the-secret".into());
    let cfg = parse_config(block(&m.endpoint(), "t-auth", json!({})));
    let s = ObjectStoreSink::with_env(cfg, Arc::new(Metrics::default()), &env).unwrap();
    let err = s.check().unwrap_err().to_string();
    assert!(err.contains("status 403 SignatureDoesNotMatch"), "{err}");
    assert!(err.contains("check the credentials"), "{err}");
    assert!(
        !err.contains("not-the-secret") && !err.contains(&m.key_id),
        "{err}"
    );
    let out = s.write_batch(&[env1(1)]);
    assert!(
        matches!(&out[0], WriteOutcome::Transient(e) if e.message.contains("403 SignatureDoesNotMatch")),
        "{out:?}"
    );
    // Missing variable: the build fails naming the variable, not a value.
    let cfg = parse_config(block(&m.endpoint(), "t-auth", json!({})));
    let err = ObjectStoreSink::with_env(cfg, Arc::new(Metrics::default()), &HashMap::new())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "sink object_store: credential_mode environment: variable T_KEY_ID is not set or empty"
    );
}

#[test]
fn check_proves_write_access_and_leaves_no_event_data() {
    let m = shared();
    m.create_bucket("t-check", true);
    let s = sink(
        m,
        "t-check",
        json!({"prefix": "events", "server_side_encryption": "AES256"}),
    );
    let verdict = s.check().unwrap();
    assert!(
        verdict.starts_with("bucket t-check at http://127.0.0.1:"),
        "{verdict}"
    );
    assert!(verdict.contains("is reachable and writable"), "{verdict}");
    assert!(
        verdict.contains("probe object events/_svc-check/probe-"),
        "{verdict}"
    );
    // The probe really was written (the bucket is versioned, so its version outlives the
    // delete), and nothing else: only the key the verdict names, under the reserved segment.
    let probe = verdict
        .split("probe object ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .trim_end_matches([',', ';', '.', ')'])
        .to_string();
    assert!(probe.starts_with("events/_svc-check/probe-"), "{verdict}");
    let versions = m.versions("t-check");
    assert_eq!(
        versions.keys().collect::<Vec<_>>(),
        [&probe],
        "{verdict}: {versions:?}"
    );
    let missing = sink(m, "t-no-such-bucket", json!({}));
    let err = missing.check().unwrap_err().to_string();
    assert!(err.contains("404 NoSuchBucket"), "{err}");
}

#[test]
fn endpoint_from_environment_follows_the_endpoint_rules() {
    let m = shared();
    m.create_bucket("t-envurl", false);
    let mut cfg = block("http://unused", "t-envurl", json!({}));
    cfg.as_object_mut().unwrap().remove("endpoint_url");
    let mut env = m.env();
    env.insert("AWS_ENDPOINT_URL_S3".into(), m.endpoint());
    let s = ObjectStoreSink::with_env(
        parse_config(cfg.clone()),
        Arc::new(Metrics::default()),
        &env,
    )
    .unwrap();
    assert!(s.check().is_ok());
    // Without allow_http_for_local_testing the same variable is refused.
    cfg["allow_http_for_local_testing"] = json!(false);
    let err = ObjectStoreSink::with_env(parse_config(cfg), Arc::new(Metrics::default()), &env)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with(
            "sink object_store: environment variable AWS_ENDPOINT_URL_S3: must use https"
        ),
        "{err}"
    );
}

/// A test CA and a server certificate for 127.0.0.1/localhost signed by it, plus a
/// self-signed certificate nobody trusts.
struct Certs {
    dir: TempDir,
}

impl Certs {
    fn new() -> Certs {
        let dir = TempDir::new("certs");
        crate::support::certs::make_certs(dir.path());
        Certs { dir }
    }
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

#[test]
fn tls_self_signed_server_is_a_clean_certificate_error() {
    let certs = Certs::new();
    let server =
        crate::support::certs::TlsServer::start(&certs.path("self.pem"), &certs.path("self.key"));
    let port = server.port;
    let env = HashMap::from([
        ("T_KEY_ID".to_string(), "AKIDEXAMPLE".to_string()),
        ("T_SECRET".to_string(), "secret".to_string()),
    ]);
    let endpoint = format!("https://127.0.0.1:{port}");
    let cfg = parse_config(block(
        &endpoint,
        "t-tls",
        json!({"allow_http_for_local_testing": false}),
    ));
    let s = ObjectStoreSink::with_env(cfg, Arc::new(Metrics::default()), &env).unwrap();
    let err = s.check().unwrap_err().to_string();
    assert!(
        err.contains("tls: rustls: invalid peer certificate"),
        "{err}"
    );
    let out = s.write_batch(&[env1(1)]);
    assert!(
        matches!(&out[0], WriteOutcome::Transient(e) if e.message.contains("invalid peer certificate")),
        "{out:?}"
    );
    drop(server);
}

/// Kills a child process this test started, also when the test panics.
#[test]
fn tls_with_the_configured_ca_succeeds() {
    let certs = Certs::new();
    let m = Moto::start_tls(
        &certs.path("server.pem"),
        &certs.path("server.key"),
        &certs.path("ca.pem"),
    );
    m.create_bucket("t-tls-ok", false);
    // Without the CA: the built-in web roots do not trust the test CA.
    let untrusted = sink(&m, "t-tls-ok", json!({}));
    let err = untrusted.check().unwrap_err().to_string();
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );
    let ca = certs.path("ca.pem");
    let s = sink(
        &m,
        "t-tls-ok",
        json!({"ca_file": ca.to_str().unwrap(), "key_strategy": "stream_sequence"}),
    );
    let verdict = s.check().unwrap();
    assert!(verdict.contains("is reachable and writable"), "{verdict}");
    assert_eq!(s.write_batch(&[env1(1)]), vec![WriteOutcome::Durable]);
    assert_eq!(
        json_of(&s, "stream-sequence/ORDERS/1.json")["stream_sequence"],
        1
    );
    // A CA file without certificates is a build error.
    std::fs::write(certs.path("empty.pem"), "not pem").unwrap();
    let cfg = parse_config(block(
        &m.endpoint(),
        "t-tls-ok",
        json!({"ca_file": certs.path("empty.pem").to_str().unwrap()}),
    ));
    let err = ObjectStoreSink::with_env(cfg, Arc::new(Metrics::default()), &m.env())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "sink object_store: ca_file: contains no PEM certificate"
    );
}

/// Write-once objects: with `object_lock` and `legal_hold` every event object (and sidecar) is
/// stored under the retention and hold asked for, with the KMS key named, and the store
/// refuses to delete it; a bucket without Object Lock refuses the sink before any put.
#[test]
fn locked_objects_keep_their_retention_hold_and_key() {
    let m = shared();
    m.create_locked_bucket("svc-locked");
    let extra = json!({"object_lock": {"mode": "COMPLIANCE", "retain_days": 2},
                       "legal_hold": true, "metadata_mode": "sidecar",
                       "server_side_encryption": "aws:kms", "kms_key_id": "alias/svc-test"});
    let s = sink(m, "svc-locked", extra.clone());
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert_all(&s.write_batch(&[env1(1), env1(2)]), WriteOutcome::Durable);
    let keys = m.versions("svc-locked");
    assert_eq!(keys.len(), 4, "two objects and their sidecars: {keys:?}");
    for key in keys.keys() {
        let lock = m.lock_of("svc-locked", key);
        assert_eq!(lock["mode"], "COMPLIANCE", "{key}: {lock}");
        assert_eq!(lock["legal_hold"], "ON", "{key}: {lock}");
        assert_eq!(lock["sse"], "aws:kms", "{key}: {lock}");
        assert_eq!(lock["kms_key_id"], "alias/svc-test", "{key}: {lock}");
        let until = lock["retain_until"].as_f64().unwrap();
        let days = (until - before) / 86_400.0;
        assert!((2.0..2.01).contains(&days), "{key}: retained {days} days");
        assert!(
            lock["delete"].as_str().unwrap().starts_with("refused"),
            "{key}: {lock}"
        );
    }
    // test-sink says what the objects get, and its probe is not locked (it was deleted).
    let verdict = s.check().unwrap();
    assert!(
        verdict.contains("the bucket has Object Lock: objects get COMPLIANCE retention of 2 days and a legal hold"),
        "{verdict}"
    );

    m.create_bucket("svc-unlocked", false);
    let refused = ObjectStoreSink::with_env(
        parse_config(block(&m.endpoint(), "svc-unlocked", extra)),
        Arc::new(Metrics::default()),
        &m.env(),
    )
    .err()
    .expect("a bucket without Object Lock is refused");
    assert!(
        refused
            .to_string()
            .contains("the bucket has no Object Lock"),
        "{refused}"
    );
}

/// The write-once fields' config errors name the field and the reason.
#[test]
fn write_once_fields_are_validated() {
    for (extra, said) in [
        (
            json!({"kms_key_id": "k"}),
            "sink.kms_key_id: only applies to server_side_encryption aws:kms",
        ),
        (
            json!({"server_side_encryption": "aws:kms", "kms_key_id": "k\n"}),
            "sink.kms_key_id: must be a KMS key id",
        ),
        (
            json!({"object_lock": {"retain_days": 1}}),
            "sink.object_lock.mode: is required",
        ),
        (
            json!({"object_lock": {"mode": "STRICT", "retain_days": 1}}),
            "sink.object_lock.mode: must be one of",
        ),
        (
            json!({"object_lock": {"mode": "GOVERNANCE"}}),
            "sink.object_lock.retain_days: is required",
        ),
        (
            json!({"object_lock": {"mode": "GOVERNANCE", "retain_days": 0}}),
            "sink.object_lock.retain_days: must be",
        ),
    ] {
        let doc = json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
            "sink": block("http://127.0.0.1:9", "b", extra.clone()),
        });
        let err = RuntimeConfig::parse(&doc.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(said), "{extra}: {err}");
    }
}
