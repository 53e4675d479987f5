//! Validation rules of the runtime config, each with its exact message.

use super::*;

const MINIMAL: &str = r#"{
  "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
  "sink": {"type": "file", "directory": "/tmp/out"}
}"#;

fn problems(text: &str) -> Vec<String> {
    match RuntimeConfig::parse(text) {
        Ok(_) => Vec::new(),
        Err(inv) => inv.0.iter().map(|p| p.to_string()).collect(),
    }
}

fn with(patch: &str) -> String {
    // Merges a JSON object patch (top-level blocks) into MINIMAL.
    let mut base: serde_json::Value = serde_json::from_str(MINIMAL).unwrap();
    let patch: serde_json::Value = serde_json::from_str(patch).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        match (base.get_mut(k), v) {
            (Some(serde_json::Value::Object(b)), serde_json::Value::Object(p)) => {
                for (pk, pv) in p {
                    b.insert(pk.clone(), pv.clone());
                }
            }
            _ => {
                base[k] = v.clone();
            }
        }
    }
    base.to_string()
}

#[test]
fn minimal_config_is_valid_with_defaults() {
    let c = RuntimeConfig::parse(MINIMAL).unwrap();
    assert_eq!(c.nats.urls, vec!["nats://127.0.0.1:4222"]);
    assert_eq!(c.delivery.batch_size, 256);
    assert_eq!(c.delivery.max_in_flight_batches, 8);
    assert_eq!(
        c.delivery.max_batch_wait,
        std::time::Duration::from_millis(100)
    );
    assert_eq!(c.delivery.sink_workers, 2);
    assert_eq!(c.delivery.nak_backoff, DEFAULT_NAK_BACKOFF);
    assert_eq!(c.sink.kind(), "file");
    assert!(!c.metrics.enabled);
    assert_eq!(c.logging.level, log::LevelFilter::Info);
}

#[test]
fn every_problem_is_reported_at_once() {
    let got = problems(
        r#"{"nats": {"url": "http://x", "stream": "a b", "subject": "a..b", "bogus": 1},
            "delivery": {"batch_size": 0, "sink_workers": 99},
            "sink": {"type": "carrier_pigeon"},
            "extra": true}"#,
    );
    assert_eq!(
        got,
        vec![
            "nats.url: must start with nats:// or tls://",
            "nats.stream: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
            "nats.consumer: is required",
            "nats.subject: must not contain empty tokens",
            "nats.bogus: unknown field",
            "delivery.batch_size: must be an integer from 1 to 10000",
            "delivery.sink_workers: must be an integer from 1 to 64",
            "sink.type: must be one of: file, object_store, http, relational_db, fanout, spool",
            "extra: unknown field",
        ]
    );
}

#[test]
fn missing_blocks() {
    assert_eq!(
        problems("{}"),
        vec!["nats: is required", "sink: is required"]
    );
    assert_eq!(
        problems("[]"),
        vec!["the configuration must be a JSON object"]
    );
}

#[test]
fn nats_url_rules() {
    let cases = [
        (
            r#"{"nats": {"url": "nats://user:pw@host:4222"}}"#,
            "nats.url: must not contain credentials; use nats.auth with environment variables",
        ),
        (
            r#"{"nats": {"url": "nats://host:4222/path"}}"#,
            "nats.url: must be scheme://host[:port] without a path",
        ),
        (
            r#"{"nats": {"urls": []}}"#,
            "nats.url: set either url or urls, not both",
        ),
    ];
    assert_eq!(problems(&with(cases[0].0)), vec![cases[0].1]);
    assert_eq!(problems(&with(cases[1].0)), vec![cases[1].1]);
    // MINIMAL has url, so adding urls conflicts.
    assert_eq!(
        problems(&with(cases[2].0)),
        vec!["nats.urls: set either url or urls, not both"]
    );
    let secret = problems(&with(r#"{"nats": {"url": "nats://admin:hunter2@h:1"}}"#)).join("\n");
    assert!(!secret.contains("hunter2"));
}

#[test]
fn nats_auth_rules() {
    assert_eq!(
        problems(&with(
            r#"{"nats": {"auth": {"mode": "user_password", "username_env": "1BAD"}}}"#
        )),
        vec![
            "nats.auth.username_env: must be an environment variable name",
            "nats.auth.password_env: is required for this auth mode",
        ]
    );
    assert_eq!(
        problems(&with(r#"{"nats": {"auth": {"mode": "token"}}}"#)),
        vec!["nats.auth.token_env: is required for this auth mode"]
    );
    assert_eq!(
        problems(&with(r#"{"nats": {"auth": {"mode": "credentials_file"}}}"#)),
        vec!["nats.auth.credentials_file: is required for this auth mode"]
    );
    assert_eq!(
        problems(&with(r#"{"nats": {"auth": {"mode": "kerberos"}}}"#)),
        vec!["nats.auth.mode: must be one of: none, user_password, token, credentials_file, nkey"]
    );
    let ok = RuntimeConfig::parse(&with(
        r#"{"nats": {"auth": {"mode": "token", "token_env": "NATS_TOKEN"}}}"#,
    ))
    .unwrap();
    assert_eq!(
        ok.nats.auth,
        NatsAuth::Token {
            token_env: "NATS_TOKEN".into()
        }
    );
}

#[test]
fn consumer_settings_rules() {
    assert_eq!(
        problems(&with(
            r#"{"nats": {"max_deliver": 0, "ack_wait_seconds": 0}}"#
        )),
        vec![
            "nats.ack_wait_seconds: must be an integer from 1 to 86400",
            "nats.max_deliver: must be -1 (unlimited) or at least 1",
        ]
    );
}

#[test]
fn delivery_rules() {
    assert_eq!(
        problems(&with(
            r#"{"delivery": {"in_progress_fraction": 1.5, "fetch_expiry_ms": 1, "max_deliveries": 0,
              "nak_backoff": {"mode": "random", "multiplier": 0.5, "jitter": "some"}}}"#
        )),
        vec![
            "delivery.fetch_expiry_ms: must be an integer from 10 to 60000",
            "delivery.in_progress_fraction: must be a number from 0.05 to 0.9",
            "delivery.nak_backoff.mode: must be one of: fixed, linear, exponential",
            "delivery.nak_backoff.multiplier: must be a number from 1 to 10",
            "delivery.nak_backoff.jitter: must be one of: none, full, equal",
            "delivery.max_deliveries: must be an integer from 1 to 1000000",
        ]
    );
}

#[test]
fn metrics_rules() {
    assert_eq!(
        problems(&with(
            r#"{"metrics": {"enabled": true, "namespace": "9bad"}}"#
        )),
        vec![
            "metrics.namespace: must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes",
            "metrics.snapshot_file: is required when metrics.enabled is true",
        ]
    );
    assert_eq!(
        problems(&with(r#"{"metrics": {"subject_families": [{"subject": "orders.>", "label": "Orders!"}, {"subject": ">.x"}]}}"#)),
        vec![
            "metrics.subject_families[0].label: must match [a-z][a-z0-9_-]*, at most 64 bytes, and not look like a credential",
            "metrics.subject_families[1].label: is required",
            "metrics.subject_families[1].subject: '>' may only be the last token",
        ]
    );
}

#[test]
fn envelope_rules() {
    assert_eq!(
        problems(&with(
            r#"{"envelope": {"keep_headers": ["Authorization", "bad name"], "stale_after_seconds": 0}}"#
        )),
        vec![
            "envelope.keep_headers[0]: looks like a secret-bearing header and is never kept",
            "envelope.keep_headers[1]: must be a header name without spaces or control characters",
            "envelope.stale_after_seconds: must be a number greater than 0 and at most 31536000",
        ]
    );
}

/// A stored signature beside an encrypted payload is a guess-confirming oracle: the
/// signature headers (default names or configured ones, any case) are never kept.
#[test]
fn signature_headers_are_never_kept() {
    assert_eq!(
        problems(&with(
            r#"{"envelope": {"keep_headers": ["Content-Type", "Svc-Signature", "svc-signature-alg", "Svc-Signature-Key-Id"]}}"#
        )),
        [1, 2, 3]
            .map(|i| format!("envelope.keep_headers[{i}]: names a signature header of authenticity; a stored signature lets anyone with the public key confirm guesses of an encrypted payload, so it is never kept"))
            .to_vec()
    );
    let renamed = problems(&with(
        r#"{"envelope": {"keep_headers": ["X-Sig", "Svc-Signature"]}, "authenticity": {"signature_header": "X-Sig"}}"#,
    ));
    assert_eq!(renamed.len(), 1, "{renamed:?}");
    assert!(renamed[0].starts_with("envelope.keep_headers[0]: names a signature header"));
}

#[test]
fn logging_and_advisories() {
    assert_eq!(
        problems(&with(
            r#"{"logging": {"level": "loud"}, "advisories": {"enabled": "yes"}}"#
        )),
        vec![
            "advisories.enabled: must be true or false",
            "logging.level: must be one of: error, warn, info, debug, trace",
        ]
    );
}

#[test]
fn subject_family_labels_are_unique() {
    assert_eq!(
        problems(&with(
            r#"{"metrics": {"subject_families": [{"subject": "orders.>", "label": "orders"}, {"subject": "orders2.>", "label": "orders"}]}}"#
        )),
        vec!["metrics.subject_families[1].label: is used by an earlier family; labels must be unique"]
    );
}

#[test]
fn label_vocabularies_must_admit_the_metadata_values_they_are_filled_with() {
    // The metadata defaults (`normal`, `unclassified`) and a rule's value fill a profile that
    // omits them; a vocabulary without them refuses every such message at run time.
    assert_eq!(
        problems(&with(
            r#"{"security_labels": {"enabled": true,
                 "allowed_priorities": ["low", "high"],
                 "allowed_classifications": ["UNCLASSIFIED", "restricted"]},
                "message_metadata": {"rules": [
                 {"subject": "orders.eu.>", "classification": "secret"},
                 {"subject": "orders.us.>", "priority": "high"}]}}"#
        )),
        vec![
            "message_metadata.default_priority: \"normal\" is not in \
             security_labels.allowed_priorities: a label profile that omits priority gets this \
             value and is refused at run time",
            "message_metadata.rules[0].classification: \"secret\" is not in \
             security_labels.allowed_classifications: a label profile that omits \
             classification gets this value and is refused at run time",
        ]
    );
    // Disabled labels, or vocabularies that admit the values: nothing to report.
    let fine = r#"{"security_labels": {"enabled": true,
                   "allowed_priorities": ["normal", "high"],
                   "allowed_classifications": ["unclassified"]},
                  "message_metadata": {"rules": [{"subject": "orders.>", "priority": "high"}]}}"#;
    assert_eq!(problems(&with(fine)), Vec::<String>::new());
    let disabled = r#"{"security_labels": {"enabled": false, "allowed_priorities": ["low"]}}"#;
    assert_eq!(problems(&with(disabled)), Vec::<String>::new());
}

#[test]
fn vocabulary_entries_differing_only_by_case_are_refused() {
    assert_eq!(
        problems(&with(
            r#"{"security_labels": {"enabled": true,
                 "allowed_classifications": ["unclassified", "Secret", "secret"],
                 "default": {"classification": "SECRET"}}}"#
        )),
        vec![
            "security_labels.allowed_classifications: \"secret\" and \"Secret\" differ only \
             by case: values compare ASCII case-insensitively and are stored in the \
             vocabulary's form; list one form",
        ]
    );
}

/// Real markings are written in capitals while metadata values are lowercase: a vocabulary
/// in capitals accepts both, and an empty profile filled from the metadata default loads.
#[test]
fn capital_markings_and_lowercase_metadata_go_together() {
    let c = r#"{"security_labels": {"enabled": true,
                 "allowed_classifications": ["UNCLASSIFIED", "SECRET"],
                 "default": {}},
                "message_metadata": {"default_classification": "unclassified",
                 "rules": [{"subject": "orders.x.>", "classification": "Secret"}]}}"#;
    assert_eq!(problems(&with(c)), Vec::<String>::new());
}

#[test]
fn any_tls_request_makes_tls_mandatory_for_every_server() {
    let nats = |extra: &str| {
        let c = RuntimeConfig::parse(&with(&format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222"{extra}}}}}"#
        )))
        .unwrap();
        c.nats.tls_required
    };
    assert!(!nats(""));
    assert!(nats(r#", "tls_required": true"#));
    assert!(nats(r#", "tls_ca_file": "/etc/svc/ca.pem""#));
    let c = RuntimeConfig::parse(&with(
        r#"{"nats": {"url": null, "urls": ["nats://127.0.0.1:4222", "tls://127.0.0.1:4223"]}}"#,
    ))
    .unwrap();
    assert!(c.nats.tls_required, "one tls:// seed puts TLS on all");
    assert_eq!(
        problems(&with(
            r#"{"nats": {"tls_ca_file": "/etc/svc/ca.pem", "tls_required": false}}"#
        )),
        vec![
            "nats.tls_required: cannot be false with a tls:// URL, tls_ca_file or a client \
             certificate: TLS applies to every server"
        ]
    );
    // A client certificate puts TLS on too, and comes with its key.
    assert!(nats(
        r#", "tls_cert_file": "/etc/svc/c.pem", "tls_key_file": "/etc/svc/c.key""#
    ));
    assert_eq!(
        problems(&with(r#"{"nats": {"tls_cert_file": "/etc/svc/c.pem"}}"#)),
        vec!["nats.tls_key_file: is required with tls_cert_file"]
    );
    assert_eq!(
        problems(&with(r#"{"nats": {"tls_key_file": "/etc/svc/c.key"}}"#)),
        vec!["nats.tls_cert_file: is required with tls_key_file"]
    );
}

#[test]
fn nkey_auth_names_its_seed_file() {
    assert_eq!(
        problems(&with(r#"{"nats": {"auth": {"mode": "nkey"}}}"#)),
        vec!["nats.auth.nkey_seed_file: is required for this auth mode"]
    );
    let c = RuntimeConfig::parse(&with(
        r#"{"nats": {"auth": {"mode": "nkey", "nkey_seed_file": "/etc/svc/user.nk"}}}"#,
    ))
    .unwrap();
    assert_eq!(
        c.nats.auth,
        NatsAuth::NKey {
            seed_file: "/etc/svc/user.nk".into()
        }
    );
}

#[test]
fn plaintext_credentials_only_to_loopback_or_by_opt_in() {
    const REFUSED: &str = "would carry the nats.auth credentials in plaintext to a \
                           non-loopback host; use tls:// (or tls_ca_file / tls_required), or \
                           set nats.allow_plaintext_credentials to true";
    let auths = [
        r#"{"mode": "token", "token_env": "T"}"#,
        r#"{"mode": "user_password", "username_env": "U", "password_env": "P"}"#,
        r#"{"mode": "credentials_file", "credentials_file": "/etc/svc/svc.creds"}"#,
    ];
    for auth in auths {
        for host in [
            "broker.example.com",
            "10.0.0.7:4222",
            "[2001:db8::1]:4222",
            "127.example",
        ] {
            let cfg = format!(r#"{{"nats": {{"url": "nats://{host}", "auth": {auth}}}}}"#);
            assert_eq!(
                problems(&with(&cfg)),
                vec![format!("nats.url: {REFUSED}")],
                "{host} {auth}"
            );
            let opt_in = format!(
                r#"{{"nats": {{"url": "nats://{host}", "auth": {auth},
                              "allow_plaintext_credentials": true}}}}"#
            );
            assert_eq!(problems(&with(&opt_in)), Vec::<String>::new());
            let tls = format!(r#"{{"nats": {{"url": "tls://{host}", "auth": {auth}}}}}"#);
            assert_eq!(problems(&with(&tls)), Vec::<String>::new());
        }
        for host in [
            "127.0.0.1:4222",
            "127.1.2.3",
            "localhost:4222",
            "LOCALHOST",
            "[::1]:4222",
        ] {
            let cfg = format!(r#"{{"nats": {{"url": "nats://{host}", "auth": {auth}}}}}"#);
            assert_eq!(problems(&with(&cfg)), Vec::<String>::new(), "{host}");
        }
    }
    // Every offending seed is named; no credentials, no problem.
    let cfg = r#"{"nats": {"url": null, "auth": {"mode": "token", "token_env": "T"},
                 "urls": ["nats://a.example", "nats://127.0.0.1", "nats://b.example"]}}"#;
    assert_eq!(
        problems(&with(cfg)),
        vec![
            format!("nats.urls[0]: {REFUSED}"),
            format!("nats.urls[2]: {REFUSED}")
        ]
    );
    assert_eq!(
        problems(&with(r#"{"nats": {"url": "nats://a.example"}}"#)),
        Vec::<String>::new()
    );
}

#[test]
fn consumer_mode_reads_its_older_spelling_and_refuses_contradictions() {
    use crate::config::ConsumerMode;
    let mode = |nats: &str| {
        RuntimeConfig::parse(&with(&format!(r#"{{"nats": {nats}}}"#))).map(|c| c.nats.consumer_mode)
    };
    let problem = |nats: &str| problems(&with(&format!(r#"{{"nats": {nats}}}"#))).join("; ");
    assert_eq!(mode("{}").unwrap(), ConsumerMode::Bind);
    assert_eq!(
        mode(r#"{"create_consumer": true}"#).unwrap(),
        ConsumerMode::Create
    );
    assert_eq!(
        mode(r#"{"consumer_mode": "reconcile", "create_consumer": true}"#).unwrap(),
        ConsumerMode::Reconcile
    );
    assert_eq!(
        problem(r#"{"consumer_mode": "bind", "create_consumer": true}"#),
        "nats.create_consumer: is true but consumer_mode is \"bind\"; set only consumer_mode"
    );
    assert_eq!(
        problem(r#"{"consumer_mode": "adopt"}"#),
        "nats.consumer_mode: must be one of: bind, create, reconcile"
    );
    assert_eq!(
        problem(r#"{"backoff_seconds": [1, 0]}"#),
        "nats.backoff_seconds: must be an array of 1 to 100 whole seconds, each from 1 to 86400"
    );
    assert_eq!(
        problem(r#"{"backoff_seconds": [1, 2, 3], "max_deliver": 2}"#),
        "nats.backoff_seconds: has 3 delays but max_deliver is 2: the broker refuses more \
         delays than deliveries"
    );
}

#[test]
fn max_in_flight_bytes_defaults_to_64_mib_and_is_bounded() {
    let c = RuntimeConfig::parse(MINIMAL).unwrap();
    assert_eq!(c.delivery.max_in_flight_bytes, 64 * 1024 * 1024);
    assert_eq!(
        problems(&with(r#"{"delivery": {"max_in_flight_bytes": 1000}}"#)),
        ["delivery.max_in_flight_bytes: must be an integer from 1048576 to 68719476736"]
    );
}

#[test]
fn spool_blocks_are_read_with_their_paths() {
    const NATS: &str = r#""nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"}"#;
    let fallback = format!(
        r#"{{{NATS}, "sink": {{"type": "file", "directory": "/tmp/out"}},
            "spool": {{"dir": "/var/spool/svc", "max_bytes": 1048576, "after_seconds": 5,
                "encryption": {{"key_id": "s2", "key_file": "/etc/svc/spool-s2.key",
                    "old_keys": [{{"key_id": "s1", "key_file": "/etc/svc/spool-s1.key"}}]}}}}}}"#
    );
    let c = RuntimeConfig::parse(&fallback).unwrap();
    let spool = c.spool.unwrap();
    assert_eq!(spool.max_bytes, 1 << 20);
    let enc = spool.encryption.unwrap();
    assert_eq!(
        (enc.current.key_id.as_str(), enc.old_keys[0].key_id.as_str()),
        ("s2", "s1")
    );
    assert!(!spool.allow_unencrypted);
    assert_eq!(spool.after, std::time::Duration::from_secs(5));
    assert_eq!(spool.max_records, i64::MAX as u64);

    let as_sink = format!(
        r#"{{{NATS}, "sink": {{"type": "spool", "dir": "/s", "max_bytes": 1048576,
            "allow_unencrypted": true, "target": {{"type": "file", "directory": "/tmp/out"}}}}}}"#
    );
    let c = RuntimeConfig::parse(&as_sink).unwrap();
    assert_eq!(c.sink.kind(), "spool");

    let bad = format!(
        r#"{{{NATS}, "sink": {{"type": "spool", "dir": "/s", "max_bytes": 1048576,
            "allow_unencrypted": true, "target": {{"type": "file", "directory": "/tmp/out"}}}},
            "spool": {{"dir": "", "after_seconds": -1, "bogus": 1, "allow_unencrypted": true}}}}"#
    );
    assert_eq!(
        problems(&bad),
        vec![
            "spool.dir: must not be empty",
            "spool.max_bytes: is required",
            "spool.after_seconds: must be a number from 0 to 86400",
            "spool.bogus: unknown field",
            "spool: must not be set when sink.type is spool",
        ]
    );
    let no_target = format!(
        r#"{{{NATS}, "sink": {{"type": "spool", "dir": "/s", "max_bytes": 1048576,
            "allow_unencrypted": true}}}}"#
    );
    assert_eq!(
        problems(&no_target),
        vec!["sink.target: is required (the sink `svc spool drain` delivers to)"]
    );
}

/// A spool is encrypted at rest unless `allow_unencrypted: true` asks otherwise: a block with
/// neither is refused naming the field, as is a key entry without its file or with a key id
/// used twice.
#[test]
fn a_spool_without_keys_or_allow_unencrypted_is_refused() {
    const NATS: &str = r#""nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"}"#;
    let required = "is required: the spool keeps every record on local disk, so it is \
                    encrypted at rest with a key file (encryption.key_id, \
                    encryption.key_file); a spool in clear must be asked for with \
                    allow_unencrypted: true";
    let fallback = format!(
        r#"{{{NATS}, "sink": {{"type": "file", "directory": "/tmp/out"}},
            "spool": {{"dir": "/s", "max_bytes": 1048576}}}}"#
    );
    assert_eq!(
        problems(&fallback),
        vec![format!("spool.encryption: {required}")]
    );
    let as_sink = format!(
        r#"{{{NATS}, "sink": {{"type": "spool", "dir": "/s", "max_bytes": 1048576,
            "target": {{"type": "file", "directory": "/tmp/out"}}}}}}"#
    );
    assert_eq!(
        problems(&as_sink),
        vec![format!("sink.encryption: {required}")]
    );
    let explicit = format!(
        r#"{{{NATS}, "sink": {{"type": "file", "directory": "/tmp/out"}},
            "spool": {{"dir": "/s", "max_bytes": 1048576, "allow_unencrypted": false}}}}"#
    );
    assert_eq!(
        problems(&explicit),
        vec![format!("spool.encryption: {required}")]
    );
    let bad_keys = format!(
        r#"{{{NATS}, "sink": {{"type": "file", "directory": "/tmp/out"}},
            "spool": {{"dir": "/s", "max_bytes": 1048576, "encryption": {{"key_id": "a/b",
                "key_file": "/k", "old_keys": [{{"key_id": "o"}},
                {{"key_id": "p", "key_file": "/p"}}, {{"key_id": "p", "key_file": "/q"}}]}}}}}}"#
    );
    assert_eq!(
        problems(&bad_keys),
        vec![
            "spool.encryption.key_id: must be 1 to 64 characters of A-Z a-z 0-9 _ - .",
            "spool.encryption.old_keys[0].key_file: is required (a file of the base64 of 32 \
             random bytes, mode 0600, owned by the service's user)",
            "spool.encryption.old_keys[2].key_id: is used by another key; key ids must be \
             unique",
        ]
    );
    // An empty key id is refused, not read as "no encryption" (the attack on the spool's
    // encryption: records were written in clear and validate said the config was valid).
    let empty_id = format!(
        r#"{{{NATS}, "sink": {{"type": "file", "directory": "/tmp/out"}},
            "spool": {{"dir": "/s", "max_bytes": 1048576, "encryption": {{"key_id": "",
                "key_file": "/k"}}}}}}"#
    );
    assert_eq!(
        problems(&empty_id),
        vec!["spool.encryption.key_id: must be 1 to 64 characters of A-Z a-z 0-9 _ - ."]
    );
}

/// Without `delivery.sink_workers`, the HTTP sink gets enough workers to keep its request
/// threads busy (batches of 256 in requests of 100: 3 requests a batch, 8 threads: 4 workers);
/// a configured value is kept, and other sinks keep the default.
#[test]
fn http_sink_workers_default_to_what_fills_its_request_threads() {
    let http = |delivery: &str, sink: &str| {
        let text = format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                          "subject": "s.>"}},
                 "delivery": {{{delivery}}},
                 "sink": {{"type": "http", "url": "https://receiver.example/in"{sink}}}}}"#
        );
        RuntimeConfig::parse(&text).unwrap().delivery.sink_workers
    };
    assert_eq!(http("", ""), 4);
    assert_eq!(http(r#""sink_workers": 2"#, ""), 2);
    assert_eq!(http(r#""batch_size": 64"#, ""), 9);
    assert_eq!(http("", r#", "max_concurrent_requests": 32"#), 12);
    assert_eq!(http("", r#", "batching": "none""#), 2);
    assert_eq!(
        http("", r#", "max_concurrent_requests": 256"#),
        64,
        "87, at most 64"
    );
    assert_eq!(
        RuntimeConfig::parse(MINIMAL).unwrap().delivery.sink_workers,
        2
    );
}

/// A config whose `nats` block is the minimal one without `subject`, plus `fields`.
fn nats_with(fields: &str) -> String {
    format!(
        r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
             {fields}}},
            "sink": {{"type": "file", "directory": "/tmp/out"}}}}"#
    )
}

#[test]
fn several_filter_subjects() {
    let c = RuntimeConfig::parse(&nats_with(r#""subjects": ["orders.a", "orders.b.>"]"#)).unwrap();
    assert_eq!(c.nats.subjects, ["orders.a", "orders.b.>"]);
    let c = RuntimeConfig::parse(MINIMAL).unwrap();
    assert_eq!(c.nats.subjects, ["orders.>"]);
    let too_many: Vec<String> = (0..65).map(|i| format!("\"s.{i}\"")).collect();
    let sixty_four = too_many[..64].join(",");
    assert!(RuntimeConfig::parse(&nats_with(&format!(r#""subjects": [{sixty_four}]"#))).is_ok());
    for (fields, said) in [
        (
            r#""subject": "orders.>", "subjects": ["orders.a"]"#,
            "nats.subjects: set either subject or subjects, not both",
        ),
        (
            r#""subjects": []"#,
            "nats.subjects: must name at least one subject",
        ),
        (
            r#""subjects": "orders.a""#,
            "nats.subjects: must be an array of strings",
        ),
        (
            r#""subjects": ["orders.a", 3]"#,
            "nats.subjects[1]: must be a string",
        ),
        (
            &format!(r#""subjects": [{}]"#, too_many.join(",")),
            "nats.subjects: names 65 subjects; at most 64 (a consumer's filter_subjects)",
        ),
        (
            r#""subjects": ["orders.a", "orders..b"]"#,
            "nats.subjects[1]: must not contain empty tokens",
        ),
        (
            r#""subjects": ["orders.a", "payments.>", "orders.*"]"#,
            "nats.subjects[2]: \"orders.*\" overlaps subjects[0] \"orders.a\": a subject \
             matches both; the filter subjects must be disjoint",
        ),
        (
            r#""subjects": ["orders.a", "orders.a"]"#,
            "nats.subjects[1]: \"orders.a\" overlaps subjects[0] \"orders.a\": a subject \
             matches both; the filter subjects must be disjoint",
        ),
        ("\"consumer_mode\": \"bind\"", "nats.subject: is required"),
    ] {
        assert_eq!(
            problems(&nats_with(fields)),
            vec![said.to_string()],
            "{fields}"
        );
    }
}

#[test]
fn where_a_new_consumer_starts() {
    use crate::broker::config::StartPosition;
    let start = |fields: &str| {
        RuntimeConfig::parse(&with(&format!(
            r#"{{"nats": {{"consumer_mode": "create", {fields}}}}}"#
        )))
        .unwrap()
        .nats
        .consumer_settings
        .start
    };
    assert_eq!(start(r#""ack_wait_seconds": 30"#), StartPosition::All);
    assert_eq!(start(r#""deliver_policy": "new""#), StartPosition::New);
    assert_eq!(
        start(r#""deliver_policy": "last_per_subject""#),
        StartPosition::LastPerSubject
    );
    assert_eq!(
        start(r#""deliver_policy": "by_start_sequence", "opt_start_seq": 42"#),
        StartPosition::ByStartSequence(42)
    );
    assert_eq!(
        start(
            r#""deliver_policy": "by_start_time", "opt_start_time": "2026-11-28T10:00:00.5+01:00""#
        ),
        StartPosition::ByStartTime(1_795_856_400_500_000_000)
    );
    let bad = |fields: &str| {
        problems(&with(&format!(
            r#"{{"nats": {{"consumer_mode": "reconcile", {fields}}}}}"#
        )))
    };
    for (fields, said) in [
        (
            r#""deliver_policy": "last""#,
            "nats.deliver_policy: must be one of: all, new, by_start_sequence, by_start_time, \
             last_per_subject",
        ),
        (
            r#""deliver_policy": "by_start_sequence""#,
            "nats.opt_start_seq: is required with deliver_policy \"by_start_sequence\"",
        ),
        (
            r#""deliver_policy": "by_start_sequence", "opt_start_seq": 0"#,
            "nats.opt_start_seq: must be an integer from 1 to 9223372036854775807",
        ),
        (
            r#""deliver_policy": "by_start_time""#,
            "nats.opt_start_time: is required with deliver_policy \"by_start_time\"",
        ),
        (
            r#""deliver_policy": "by_start_time", "opt_start_time": "yesterday""#,
            "nats.opt_start_time: must be an RFC 3339 time, e.g. 2026-11-26T14:00:00Z",
        ),
        (
            r#""deliver_policy": "by_start_time", "opt_start_time": "3026-01-01T00:00:00Z""#,
            "nats.opt_start_time: must lie between 1677-09-21T00:12:44Z and 2262-04-11T23:47:16Z: \
             the broker keeps a start time as signed 64-bit nanoseconds since 1970, and one \
             outside that range starts the consumer elsewhere (at the stream's start or its \
             end) while it reports the time asked for",
        ),
        (
            r#""opt_start_seq": 5"#,
            "nats.opt_start_seq: goes only with deliver_policy \"by_start_sequence\"",
        ),
        (
            r#""deliver_policy": "by_start_sequence", "opt_start_seq": 5,
                "opt_start_time": "2026-11-28T10:00:00Z""#,
            "nats.opt_start_time: goes only with deliver_policy \"by_start_time\"",
        ),
    ] {
        assert_eq!(bad(fields), vec![said.to_string()], "{fields}");
    }
    let bind = problems(&with(
        r#"{"nats": {"consumer_mode": "bind", "deliver_policy": "new"}}"#,
    ));
    assert_eq!(bind.len(), 1, "{bind:?}");
    assert!(
        bind[0].starts_with("nats.deliver_policy: applies only to a consumer the runner creates"),
        "{bind:?}"
    );
}

#[test]
fn fanout_routes_must_match_values_the_envelope_can_carry() {
    let mut cfg: serde_json::Value = serde_json::from_str(&with(
        r#"{"security_labels": {"enabled": true,
             "allowed_priorities": ["normal", "high"],
             "allowed_classifications": ["unclassified", "restricted"]},
            "envelope": {"keep_headers": ["Tenant"]}}"#,
    ))
    .unwrap();
    let route =
        |m: serde_json::Value| serde_json::json!({"name": "r", "match": m, "targets": ["f"]});
    let sink = |routes: serde_json::Value| {
        serde_json::json!({"type": "fanout",
            "sinks": {"f": {"type": "file", "directory": "/tmp/svc-cfg-fanout"}},
            "routing": {"enabled": true, "routes": routes}})
    };
    cfg["sink"] = sink(serde_json::json!([route(serde_json::json!({
        "priority": ["urgent"], "classification": ["secret", "restricted"],
        "headers": {"Tenant": "acme", "Region": "eu"}}))]));
    assert_eq!(
        problems(&cfg.to_string()),
        vec![
            "sink.routing.routes[0].match.headers.Region: is not in envelope.keep_headers, so \
             the envelope never carries it and no message could match",
            "sink.routing.routes[0].match.priority: urgent is not in \
             security_labels.allowed_priorities, so no message could match",
            "sink.routing.routes[0].match.classification: secret is not in \
             security_labels.allowed_classifications, so no message could match",
        ]
    );
    cfg["sink"] = sink(serde_json::json!([route(serde_json::json!({
        "priority": ["high"], "classification": ["restricted"],
        "headers": {"Tenant": "acme"}}))]));
    assert_eq!(problems(&cfg.to_string()), Vec::<String>::new());
}
