//! The dead-letter queue (DLQ): where a message that can never be delivered goes, as a
//! sanitized failure record, before the original is acknowledged.
//!
//! Flow (see `docs/dead-letter.md`): the normalizer finds a permanent pre-sink failure (an
//! invalid security label profile, an invalid metadata header, ...) and builds a [`DeadLetter`]
//! from the raw message and the [`Failure`] (pure: [`DeadLetter::build`]). The ack thread
//! publishes it with [`DeadLetterPublisher::publish`], which returns only when the broker has
//! stored it in a stream (JetStream PubAck); only then is the original ACKed. Any publish
//! failure is an error, so the original is NAKed and comes back.
//!
//! What the record holds: schema `svc.dead-letter.v1`, the failure (stage, field, reason code,
//! value-free message, every problem found), where the original lives (subject, stream,
//! stream and consumer sequence, consumer, delivery count, publisher message ID, broker time),
//! the payload's SHA-256 and size, and only the headers an operator allow-listed. Never the
//! payload body, never the offending value, never a secret-looking header: the original stays
//! in its stream (by sequence) for anyone entitled to read it.

mod config;
mod publish;
mod record;
mod stored;

pub use config::*;
pub use publish::*;
pub use record::*;
pub use stored::*;

#[cfg(test)]
mod tests {
    use super::stored::*;
    use super::*;
    use crate::document::reader::{parse_json, ObjectReader, Problems};
    use crate::message::envelope::{hex_sha256, RawMessage, MESSAGE_ID_HEADER};
    use crate::message::failure::FailureClass;

    #[test]
    fn settings_that_remove_dead_letters_are_named() {
        let drops = |v: serde_json::Value| dropping_settings(&v);
        assert!(drops(
            serde_json::json!({"max_msgs": -1, "max_bytes": -1, "max_age": 0,
                                         "storage": "file", "retention": "limits"})
        )
        .is_empty());
        assert_eq!(
            drops(
                serde_json::json!({"max_msgs": 1, "max_age": 86_400_000_000_000i64,
                                     "storage": "memory", "retention": "workqueue"})
            ),
            [
                "max_msgs 1 (discard old)",
                "storage memory",
                "retention workqueue"
            ]
        );
        assert!(
            drops(serde_json::json!({"max_msgs": 1, "max_bytes": 10, "discard": "new"})).is_empty()
        );
    }

    fn cfg(text: &str) -> Result<DeadLetterConfig, Vec<String>> {
        let v = parse_json(text).unwrap();
        let p = Problems::new();
        let c = DeadLetterConfig::read(Some(ObjectReader::at("dead_letter".into(), &v, &p)));
        let p = p.into_vec();
        if p.is_empty() {
            Ok(c)
        } else {
            Err(p.iter().map(|p| p.to_string()).collect())
        }
    }

    fn raw() -> RawMessage {
        RawMessage {
            consumer_sequence: 7,
            delivery_count: 2,
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers: vec![
                ("Nats-Msg-Id".into(), "m-1".into()),
                ("Content-Type".into(), "application/json".into()),
                (
                    "Svc-Security-Labels".into(),
                    "{\"owner\":\"TOPSECRETVALUE\"}".into(),
                ),
                ("Authorization".into(), "Bearer hunter2".into()),
                ("X-Big".into(), "b".repeat(2000)),
            ],
            ..RawMessage::sample("orders.eu", 42, br#"{"card":"4111111111111111"}"#)
        }
    }

    #[test]
    fn config_defaults_and_problems() {
        let c = cfg("{}").unwrap();
        assert_eq!(c, DeadLetterConfig::default());
        assert_eq!(
            cfg(r#"{"enabled": true, "include_headers": ["X-Api-Key", "a b"], "publish_timeout_ms": 1,
                    "expected_stream": "no spaces", "extra": 1}"#)
            .unwrap_err(),
            vec![
                "dead_letter.subject: is required when dead_letter.enabled is true",
                "dead_letter.include_headers[0]: looks like a secret-bearing header and is never copied",
                "dead_letter.include_headers[1]: must be a header name without spaces or control characters",
                "dead_letter.publish_timeout_ms: must be an integer from 10 to 60000",
                "dead_letter.expected_stream: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                "dead_letter.extra: unknown field",
            ]
        );
        for (subject, msg) in [
            (
                "dlq.*",
                "dead_letter.subject: must be a literal subject without wildcards",
            ),
            (
                "dlq..x",
                "dead_letter.subject: must not contain empty tokens",
            ),
            (
                "$JS.dlq",
                "dead_letter.subject: must not be in a reserved subject tree ($... or _INBOX.)",
            ),
        ] {
            assert_eq!(
                cfg(&format!(r#"{{"enabled": true, "subject": "{subject}"}}"#)).unwrap_err(),
                vec![msg]
            );
        }
        let c =
            cfg(r#"{"enabled": true, "subject": "orders.dlq", "include_headers": ["Svc-Labels"]}"#)
                .unwrap();
        let p = Problems::new();
        c.cross_check(
            &["orders.>".to_string()],
            &["Svc-Security-Labels", "Svc-Labels"],
            &p,
        );
        let got: Vec<String> = p.into_vec().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "dead_letter.subject: must not match nats.subject (the runner would consume its own dead letters)",
                "dead_letter.include_headers[0]: names a validated header whose value may be the reason of the failure; it is never copied",
            ]
        );
    }

    #[test]
    fn a_replayed_record_adds_one_field_and_its_own_message_id() {
        let c = DeadLetterConfig {
            enabled: true,
            subject: "dlq".into(),
            ..Default::default()
        };
        let failure = Failure::new("input", "headers", "too_many_headers", "x".into());
        let dl = DeadLetter::build(&raw(), &failure, 1_700_000_001_000_000_000, &c);
        let replayed = dl.clone().replayed();
        assert_eq!(replayed.msg_id, "svc-dlq-replay:ORDERS:42");
        assert_eq!(replayed.reason, dl.reason);
        let mut before: serde_json::Value = serde_json::from_slice(&dl.body).unwrap();
        let after: serde_json::Value = serde_json::from_slice(&replayed.body).unwrap();
        assert!(before.get("replayed").is_none());
        before["replayed"] = serde_json::Value::Bool(true);
        assert_eq!(before, after, "only the replayed field is added");
    }

    #[test]
    fn record_is_sanitized() {
        let c = DeadLetterConfig {
            enabled: true,
            subject: "dlq".into(),
            include_headers: vec!["Content-Type".into(), "X-Big".into(), "Missing".into()],
            ..Default::default()
        };
        let labels = crate::message::labels::SecurityLabelsConfig {
            enabled: true,
            allowed_classifications: ["a".to_string()].into(),
            ..Default::default()
        };
        let mut m = raw();
        m.headers[2].1 = r#"{"classification":"TOPSECRETVALUE","extensions":{"x":1}}"#.into();
        let meta = crate::message::metadata::MessageMetadataConfig::default()
            .resolve(&m)
            .unwrap();
        let rejection = labels.resolve(&m, &meta).unwrap_err();
        let failure = Failure::from(&rejection);
        let dl = DeadLetter::build(&m, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(dl.msg_id, "svc-dlq:ORDERS:42");
        // The stream's incarnation, when known, tells a stream created again from the old one.
        let again = RawMessage {
            stream_incarnation: "20261128T071943.5Z".into(),
            ..m.clone()
        };
        let dl2 = DeadLetter::build(&again, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(dl2.msg_id, "svc-dlq:ORDERS:20261128T071943.5Z:42");
        let v: serde_json::Value = serde_json::from_slice(&dl2.body).unwrap();
        assert_eq!(v["original"]["stream_incarnation"], "20261128T071943.5Z");
        assert_eq!(dl.reason, "not_in_vocabulary");
        let text = String::from_utf8(dl.body.clone()).unwrap();
        for never in ["TOPSECRETVALUE", "hunter2", "4111", "card", "bbbbbbbb"] {
            assert!(!text.contains(never), "{never} in {text}");
        }
        let v: serde_json::Value = serde_json::from_slice(&dl.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "schema": "svc.dead-letter.v1",
                "failed_at": "2023-11-14T22:13:21Z",
                "failure": {
                    "stage": "security_labels",
                    "field": "security_labels.classification",
                    "reason": "not_in_vocabulary",
                    "message": "security_labels.classification: value is not in security_labels.allowed_classifications",
                    "problems": [{"field": "security_labels.classification", "reason": "not_in_vocabulary"}]
                },
                "original": {
                    "subject": "orders.eu", "stream": "ORDERS", "stream_sequence": 42,
                    "consumer": "svc", "consumer_sequence": 7, "delivery_count": 2,
                    "message_id": "m-1", "published_at": "2023-11-14T22:13:20Z"
                },
                "payload": {"sha256": hex_sha256(&m.data), "size_bytes": 27},
                "headers": {"Content-Type": "application/json", "X-Big": "(omitted: 2000 bytes)"}
            })
        );
    }

    #[test]
    fn metadata_failures_convert() {
        let c = crate::message::metadata::MessageMetadataConfig::default();
        let mut m = raw();
        m.headers
            .push(("Svc-Priority".into(), "SECRET;VALUE".into()));
        let e = c.resolve(&m).unwrap_err();
        let f = Failure::from(&e);
        assert_eq!(f.stage, "message_metadata");
        assert_eq!(f.field, "message_metadata.priority");
        assert_eq!(f.reason, "invalid_value");
        assert!(!serde_json::to_string(&f).unwrap().contains("SECRET"));
    }

    /// A duplicate PubAck is believed only for this very record: the same message (issue
    /// 51.11), and the same failure, headers and original (review 51: a forged record with
    /// the real identity and payload digest but its own failure was taken for ours).
    #[test]
    fn a_duplicate_counts_only_for_this_very_record() {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let c = DeadLetterConfig::default();
        let failure = Failure::new("normalize", "payload", "invalid_json", "bad".into());
        let m = RawMessage {
            stream_incarnation: "20261128T071943Z".into(),
            ..raw()
        };
        let first = DeadLetter::build(&m, &failure, 1_700_000_001_000_000_000, &c);
        let ours = vec![
            (MESSAGE_ID_HEADER, first.msg_id.clone()),
            ("Content-Type", "application/json".to_string()),
            (REASON_HEADER, first.reason.to_string()),
        ];
        let head = |lines: &[(&str, &str)]| {
            let mut h = b"NATS/1.0\r\n".to_vec();
            for (n, v) in lines {
                h.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            h.extend_from_slice(b"\r\n");
            h
        };
        let our_head = head(&[
            ("Svc-Dlq-Reason", "invalid_json"),
            ("nats-msg-id", &first.msg_id),
            ("Content-Type", "application/json"),
        ]);
        let stored = |data: &[u8]| StoredMessage {
            subject: c.subject.clone(),
            headers: our_head.clone(),
            data: data.to_vec(),
        };
        let check = |s: &StoredMessage| same_record(s, &first, &c.subject, &ours);
        // An earlier delivery's record: another time, delivery count and consumer sequence.
        let again = RawMessage {
            delivery_count: 5,
            consumer_sequence: 99,
            ..m.clone()
        };
        let later = DeadLetter::build(&again, &failure, 1_700_000_009_000_000_000, &c);
        assert_ne!(first.body, later.body);
        assert_eq!(check(&stored(&later.body)), Ok(()));
        // Another incarnation's message 42, or another payload: not ours.
        let old = RawMessage {
            stream_incarnation: "20251128T071943Z".into(),
            ..m.clone()
        };
        let old = DeadLetter::build(&old, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(
            check(&stored(&old.body)),
            Err("is a record of another message")
        );
        let forged = RawMessage {
            data: b"other".to_vec(),
            ..m.clone()
        };
        let forged = DeadLetter::build(&forged, &failure, 1_700_000_001_000_000_000, &c);
        assert!(check(&stored(&forged.body)).is_err());
        // The same message's identity and digest with the forger's failure, headers, an
        // extra field, or one missing: not ours either.
        let body: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
        for change in [
            ("/failure/reason", serde_json::json!("forged")),
            ("/failure/message", serde_json::json!("nothing wrong here")),
            ("/headers", serde_json::json!({"X-Forged": "yes"})),
            ("/original/consumer", serde_json::json!("other")),
            ("/extra", serde_json::json!(1)),
        ] {
            let mut v = body.clone();
            match v.pointer_mut(change.0) {
                Some(slot) => *slot = change.1.clone(),
                None => v["extra"] = change.1.clone(),
            }
            let data = serde_json::to_vec(&v).unwrap();
            assert!(check(&stored(&data)).is_err(), "{}", change.0);
        }
        let mut v = body.clone();
        v["original"].as_object_mut().unwrap().remove("message_id");
        assert!(check(&stored(&serde_json::to_vec(&v).unwrap())).is_err());
        // Our body under other headers or on another subject: not ours.
        for bad_head in [
            head(&[("Svc-Dlq-Reason", "forged"), ("Nats-Msg-Id", &first.msg_id)]),
            head(&[
                ("Svc-Dlq-Reason", "invalid_json"),
                ("Nats-Msg-Id", &first.msg_id),
                ("Content-Type", "application/json"),
                ("X-Forged", "yes"),
            ]),
            Vec::new(),
            b"HTTP/1.1 200\r\n\r\n".to_vec(),
        ] {
            let s = StoredMessage {
                headers: bad_head,
                ..stored(&first.body)
            };
            assert!(check(&s).is_err());
        }
        let elsewhere = StoredMessage {
            subject: "dlq.other".into(),
            ..stored(&first.body)
        };
        assert_eq!(check(&elsewhere), Err("is on another subject"));
        assert!(check(&stored(b"not json")).is_err());
        assert!(check(&stored(br#"{"original":{}}"#)).is_err());

        let answer = serde_json::json!({"message": {"subject": "dlq", "seq": 3,
            "hdrs": b64(&our_head), "data": b64(&first.body)}})
        .to_string();
        let read = stored_message(answer.as_bytes()).unwrap();
        assert_eq!((read.data, read.headers), (first.body.clone(), our_head));
        let no_headers =
            serde_json::json!({"message": {"subject": "dlq", "data": b64(b"{}")}}).to_string();
        assert!(stored_message(no_headers.as_bytes())
            .unwrap()
            .headers
            .is_empty());
        assert!(stored_message(br#"{"message":{"subject":"d","data":"%%"}}"#).is_none());
        assert!(stored_message(br#"{"message":{"data":"e30="}}"#).is_none());
        assert!(stored_message(br#"{"error":{"code":404}}"#).is_none());
        for bad in ["", "A.B", "A*", ">", "A B", "A\u{7}"] {
            assert!(!is_stream_name(bad), "{bad}");
        }
        assert!(is_stream_name("ORDERS_DLQ"));
    }

    #[test]
    fn pub_ack_parsing() {
        assert_eq!(
            parse_pub_ack(br#"{"stream":"DLQ","seq":5}"#),
            Ok(PubAck {
                stream: "DLQ".into(),
                sequence: 5,
                duplicate: false
            })
        );
        assert!(
            parse_pub_ack(br#"{"stream":"DLQ","seq":5,"duplicate":true}"#)
                .unwrap()
                .duplicate
        );
        assert_eq!(
            parse_pub_ack(br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#),
            Err(DlqError::Rejected {
                code: 503,
                description: "maximum messages exceeded".into()
            })
        );
        assert_eq!(parse_pub_ack(b"nope"), Err(DlqError::BadAck));
        assert_eq!(parse_pub_ack(b"{}"), Err(DlqError::BadAck));
    }

    #[test]
    fn a_hostile_broker_answer_is_bounded_and_escaped_in_the_error() {
        let forged = format!(
            "limits\n2026-01-01T00:00:00.000Z INFO  [svc-ack] fine{}{}",
            '\u{202e}',
            "x".repeat(1 << 20)
        );
        let answer = serde_json::json!({"error": {"code": 503, "description": forged}});
        let err = parse_pub_ack(answer.to_string().as_bytes()).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("dlq publish: refused by the stream (503: limits\\n2026"),
            "{shown}"
        );
        assert!(!shown.contains(['\n', '\u{202e}']), "{shown}");
        assert!(shown.len() < 400, "{} bytes", shown.len());
        let wrong = DlqError::WrongStream {
            stream: "DLQ\r\nforged".repeat(1000),
        };
        let shown = wrong.to_string();
        assert!(
            !shown.contains(['\n', '\r']) && shown.len() < 400,
            "{shown}"
        );
    }

    /// A 20,000-byte message id of control characters became a 120 KB record (six bytes per
    /// escaped character) that a DLQ stream with a 64 KiB `max_msg_size` refuses: capped as
    /// included headers are; and an id whose object key was invalid is withheld.
    #[test]
    fn a_huge_message_id_keeps_the_record_small() {
        let mut m = raw();
        m.headers[0].1 = "\u{1}".repeat(20_000);
        let failure = Failure::new("x", "x", "x", "x".into());
        let d = DeadLetter::build(&m, &failure, 0, &DeadLetterConfig::default());
        assert!(d.body.len() < 2048, "{} bytes", d.body.len());
        let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(v["original"]["message_id"], "(omitted: 20000 bytes)");
        // Up to the bound the id is kept whole.
        m.headers[0].1 = "i".repeat(MAX_HEADER_VALUE_BYTES);
        let d = DeadLetter::build(&m, &failure, 0, &DeadLetterConfig::default());
        let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(v["original"]["message_id"].as_str().unwrap().len(), 1024);

        let mut m = raw();
        m.headers[0].1 = "../../evil-id".into();
        let (env, _) = crate::message::envelope::normalize(&m, 0, &Default::default());
        let err = crate::sink::SinkError::new("object_store", "bad key")
            .classified(FailureClass::InvalidKey);
        let d = DeadLetter::build_for_sink(
            &env,
            (err.sink, err.class),
            0,
            &DeadLetterConfig::default(),
        );
        let text = String::from_utf8(d.body).unwrap();
        assert!(!text.contains("evil-id"), "{text}");
        assert!(text.contains(WITHHELD_ID), "{text}");
    }

    /// A permanent sink failure's record names the sink and the class, never the sink's
    /// message; a keyed (encrypted) payload digest is labelled `hmac_sha256`, never `sha256`.
    #[test]
    fn sink_failure_records_are_value_free_and_label_keyed_digests() {
        let cfg = DeadLetterConfig::default();
        let (mut env, _) = crate::message::envelope::normalize(
            &raw(),
            1_700_000_001_000_000_000,
            &Default::default(),
        );
        let err =
            crate::sink::SinkError::new("relational_db", "row rejected: Key (id)=(SECRETVALUE)")
                .classified(crate::sink::FailureClass::ValueRejected);
        let plain = DeadLetter::build_for_sink(&env, (err.sink, err.class), 0, &cfg);
        let text = String::from_utf8(plain.body.clone()).unwrap();
        assert!(!text.contains("SECRETVALUE"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["failure"]["stage"], "sink");
        assert_eq!(v["failure"]["field"], "sink.relational_db");
        assert_eq!(v["failure"]["reason"], "value_rejected");
        assert_eq!(v["payload"]["sha256"], env.payload_info.sha256.as_str());
        assert!(v["payload"].get("hmac_sha256").is_none());

        env.payload_info.sha256 = "ab".repeat(32);
        env.payload_info.keyed = true;
        let keyed = DeadLetter::build_for_sink(&env, (err.sink, err.class), 0, &cfg);
        let v: serde_json::Value = serde_json::from_slice(&keyed.body).unwrap();
        assert!(v["payload"].get("sha256").is_none(), "{v}");
        assert_eq!(v["payload"]["hmac_sha256"], "ab".repeat(32).as_str());
    }
}
