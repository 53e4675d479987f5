//! Unit tests of publisher authenticity: signed bytes, each failure reason, config, vectors.

use ring::signature::{Ed25519KeyPair, KeyPair};

use super::*;
use crate::document::reader::Problems;
use serde_json::Value;

/// The documented test-vector keys (docs/payload-protection.md).
pub const VECTOR_HMAC_SECRET: [u8; 32] = [0x0b; 32];
pub const VECTOR_ED25519_SEED: [u8; 32] = [0x01; 32];

fn ed_pair() -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&VECTOR_ED25519_SEED).unwrap()
}

fn verifier(rules: &str, default_required: bool) -> Verifier {
    let doc = format!(
        r#"{{"enabled":true,"default_required":{default_required},
            "keys":[{{"key_id":"ed1","public_key_b64":"{}"}},
                    {{"key_id":"ed2","public_key_b64":"{}"}}],
            "rules":{rules}}}"#,
        B64.encode(ed_pair().public_key().as_ref()),
        B64.encode(
            Ed25519KeyPair::from_seed_unchecked(&[2; 32])
                .unwrap()
                .public_key()
                .as_ref()
        ),
    );
    let v: Value = serde_json::from_str(&doc).unwrap();
    let p = Problems::new();
    let cfg = AuthenticityConfig::read(Some(ObjectReader::at("authenticity".into(), &v, &p)));
    assert!(p.is_empty(), "{:?}", p.into_vec());
    let mut ver = Verifier::load(&cfg).unwrap();
    // The HMAC key is added directly (its source is the environment in real configs).
    ver.keys.push((
        "h1".into(),
        VerifyKey::Hmac(hmac::Key::new(hmac::HMAC_SHA256, &VECTOR_HMAC_SECRET)),
    ));
    ver
}

fn msg(subject: &str, headers: &[(&str, &str)], data: &[u8]) -> RawMessage {
    RawMessage {
        stream: "S".into(),
        consumer: "c".into(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..RawMessage::sample(subject, 1, data)
    }
}

fn ed_sig(id: Option<&str>, data: &[u8], subject: &str) -> String {
    B64.encode(ed_pair().sign(&signed_bytes(id, data, subject)).as_ref())
}

fn hmac_sig(id: Option<&str>, data: &[u8], subject: &str) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, &VECTOR_HMAC_SECRET);
    B64.encode(hmac::sign(&k, &signed_bytes(id, data, subject)).as_ref())
}

#[test]
fn signed_bytes_are_the_canonical_json() {
    assert_eq!(
        String::from_utf8(signed_bytes(
            Some("order-1"),
            b"{\"a\":1}",
            "orders.created"
        ))
        .unwrap(),
        format!(
            r#"{{"message_id":"order-1","payload_sha256":"{}","subject":"orders.created"}}"#,
            hex_sha256(b"{\"a\":1}")
        )
    );
    assert!(String::from_utf8(signed_bytes(None, b"", "s"))
        .unwrap()
        .starts_with(r#"{"message_id":null,"#));
    assert!(
        String::from_utf8(signed_bytes(Some("q\"\\\n\u{e9}"), b"", "s"))
            .unwrap()
            .contains(r#""message_id":"q\"\\\n"#)
    );
}

#[test]
fn valid_signatures_pass_and_each_failure_has_its_reason() {
    let v = verifier(
        r#"[{"subject":"orders.>","required":true,"algorithms":["ed25519"],"key_ids":["ed1"]}]"#,
        false,
    );
    let data = b"{\"a\":1}";
    let good = ed_sig(Some("m1"), data, "orders.x");
    let signed = |alg: &str, key: &str, sig: &str| {
        msg(
            "orders.x",
            &[
                ("Nats-Msg-Id", "m1"),
                ("Svc-Signature-Alg", alg),
                ("Svc-Signature-Key-Id", key),
                ("Svc-Signature", sig),
            ],
            data,
        )
    };
    assert_eq!(
        v.check(&signed("ed25519", "ed1", &good)),
        Ok(AuthOutcome::Verified(Algorithm::Ed25519))
    );
    assert_eq!(
        v.check(&msg("orders.x", &[], data)),
        Err(AuthFailure::MissingSignature)
    );
    assert_eq!(v.check(&msg("other", &[], data)), Ok(AuthOutcome::Unsigned));
    assert_eq!(
        v.check(&signed(
            "hmac-sha256",
            "h1",
            &hmac_sig(Some("m1"), data, "orders.x")
        )),
        Err(AuthFailure::DisallowedAlgorithm)
    );
    assert_eq!(
        v.check(&signed("rsa", "ed1", &good)),
        Err(AuthFailure::DisallowedAlgorithm)
    );
    assert_eq!(
        v.check(&signed("ed25519", "ed2", &good)),
        Err(AuthFailure::UnknownKey),
        "not allowed by the rule"
    );
    assert_eq!(
        v.check(&signed("ed25519", "nobody", &good)),
        Err(AuthFailure::UnknownKey)
    );
    assert_eq!(
        v.check(&signed("ed25519", "ed1", "!!")),
        Err(AuthFailure::MalformedSignature)
    );
    let other = ed_sig(Some("m2"), data, "orders.x");
    assert_eq!(
        v.check(&signed("ed25519", "ed1", &other)),
        Err(AuthFailure::BadSignature)
    );
    // A changed payload or subject breaks the signature.
    let mut m = signed("ed25519", "ed1", &good);
    m.data = b"{\"a\":2}".to_vec();
    assert_eq!(v.check(&m), Err(AuthFailure::BadSignature));
    // Partial or repeated headers.
    assert_eq!(
        v.check(&msg("orders.x", &[("Svc-Signature", &good)], data)),
        Err(AuthFailure::MalformedSignature)
    );
    let mut m = signed("ed25519", "ed1", &good);
    m.headers.push(("Svc-Signature".into(), good.clone()));
    assert_eq!(v.check(&m), Err(AuthFailure::MalformedSignature));
}

#[test]
fn hmac_signatures_verify_and_a_present_signature_is_always_checked() {
    let v = verifier("[]", false);
    let data = b"hello";
    let sig = hmac_sig(None, data, "any.subject");
    let m = |s: &str| {
        msg(
            "any.subject",
            &[
                ("Svc-Signature-Alg", "hmac-sha256"),
                ("Svc-Signature-Key-Id", "h1"),
                ("Svc-Signature", s),
            ],
            data,
        )
    };
    assert_eq!(
        v.check(&m(&sig)),
        Ok(AuthOutcome::Verified(Algorithm::HmacSha256))
    );
    let mut bad = B64.decode(&sig).unwrap();
    bad[0] ^= 1;
    assert_eq!(
        v.check(&m(&B64.encode(bad))),
        Err(AuthFailure::BadSignature)
    );
    // An Ed25519 key id under the HMAC algorithm is unknown for that algorithm.
    let m2 = msg(
        "any.subject",
        &[
            ("Svc-Signature-Alg", "hmac-sha256"),
            ("Svc-Signature-Key-Id", "ed1"),
            ("Svc-Signature", &sig),
        ],
        data,
    );
    assert_eq!(v.check(&m2), Err(AuthFailure::UnknownKey));
    assert_eq!(
        verifier("[]", true).check(&msg("any", &[], data)),
        Err(AuthFailure::MissingSignature)
    );
}

#[test]
fn config_problems_name_the_field() {
    let v: Value = serde_json::from_str(
        r#"{"enabled":true,"keys":[{"key_id":"a","secret_env":"A","public_key_b64":"x"},{"key_id":"b","public_key_b64":"short"}],
            "rules":[{"subject":"x","algorithms":["rsa"],"key_ids":["zz"]}],"signature_header":"Svc-Signature-Alg"}"#,
    )
    .unwrap();
    let p = Problems::new();
    AuthenticityConfig::read(Some(ObjectReader::at("authenticity".into(), &v, &p)));
    let p: Vec<String> = p.into_vec().iter().map(|p| p.to_string()).collect();
    for want in [
        "keys[0].secret_env",
        "keys[1].public_key_b64",
        "rules[0].algorithms[0]",
        "rules[0].key_ids[0]",
        "signature_header",
    ] {
        assert!(p.iter().any(|m| m.contains(want)), "{want}: {p:?}");
    }
}

/// The published test vectors (docs/payload-protection.md, "Test vectors"): Python checks
/// them independently in tests/payload_protection.rs (computed first with Python
/// `cryptography` and `hmac`, then matched here).
#[test]
fn published_test_vectors() {
    let data = br#"{"order":42}"#;
    let signed = signed_bytes(Some("order-42"), data, "orders.created");
    assert_eq!(
        String::from_utf8(signed.clone()).unwrap(),
        r#"{"message_id":"order-42","payload_sha256":"54985dc3c12fada7a1b1db53cf23d3cbd4bcbe64e1cef95071e2073e2ceff4ed","subject":"orders.created"}"#
    );
    assert_eq!(
        hmac_sig(Some("order-42"), data, "orders.created"),
        "YYF+nTy479JdOcRWilZ17o1BDBiakmmGLmEX6a6+b+8="
    );
    assert_eq!(
        B64.encode(ed_pair().public_key().as_ref()),
        "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w="
    );
    assert_eq!(
        ed_sig(Some("order-42"), data, "orders.created"),
        "+1DJ4yWz28XtJx15my8Th3cb5FAPuvDVejhUKs/21O2Q7B5oJXQ6itjIR3zsnPJ3RG9YYIJijJbPqtY5mnCGBw=="
    );
}

#[test]
fn debug_shows_key_ids_only() {
    let v = verifier("[]", false);
    let d = format!("{v:?}");
    assert!(
        d.contains("h1") && d.contains("ed1") && d.contains("redacted"),
        "{d}"
    );
    assert!(!d.contains("11, 11"), "{d}");
}
