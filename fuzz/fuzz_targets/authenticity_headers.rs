//! Publisher signature headers (src/message/protection/authenticity.rs): `Svc-Signature-Alg`,
//! `Svc-Signature-Key-Id`, `Svc-Signature` (base64) and the signed bytes built from the
//! untrusted subject, message id and payload (`signed_bytes`, canonical JSON).
//!
//! Builds a `RawMessage` from the input and runs `Verifier::check` with a fixed HMAC key
//! (`h1`, through the environment variable the config names) and a fixed Ed25519 public key
//! (`ed1`, inline), the default header names, and one rule: `signed.>` requires an Ed25519
//! signature by `ed1`; other subjects need none unless bit 5 of the selector makes it the
//! default.
//!
//! Layout: selector byte; then subject, message id, algorithm, key id and signature, each one
//! length byte and that many bytes (lossy UTF-8); the rest is the payload. Selector bits 0-3:
//! whether the message id, algorithm, key id and signature headers are present; bit 4: one of
//! them repeated; bits 6-7: 0 = the input's own signature, 1 = the target signs with the HMAC
//! key, 2 = with the Ed25519 key (header values then `hmac-sha256`/`h1` or `ed25519`/`ed1`),
//! 3 = the target signs and then the input's signature bytes are appended to the signature.
//!
//! Properties: no panic; an input never verifies with its own signature (it cannot know the
//! keys); a message the target signed verifies with its algorithm unless the rule forbids
//! it (then `disallowed_algorithm`); every failure is one of the documented codes with a clean
//! Display; the signed bytes are canonical JSON: they parse to exactly `message_id`,
//! `payload_sha256` (hex SHA-256 of the payload) and `subject`, and re-serialize byte for byte.
#![no_main]

use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::Value;
use svc::message::envelope::{hex_sha256, RawMessage, MESSAGE_ID_HEADER};
use svc::message::protection::authenticity::{
    signed_bytes, Algorithm, AuthFailure, AuthOutcome, AuthRule, AuthenticityConfig, Verifier,
    VerifyKeyEntry, VerifyKeySource,
};
use svc::document::canonical::write_value as canonical_json;
use svc::message::protection::keys::KeySource;
use svc::message::subject::SubjectPattern;
use svc_fuzz::{assert_clean_display, split_selector};

const HMAC_ENV: &str = "SVC_FUZZ_AUTH_HMAC_KEY";
// Not the documented test-vector keys: a seed holding a documented signature must not verify.
const HMAC_KEY: [u8; 32] = [0x5a; 32];
const ED_SEED: [u8; 32] = [0x07; 32];
/// The documented reason codes (docs/payload-protection.md, DLQ `failure.reason`).
const CODES: &[&str] = &[
    "missing_signature",
    "malformed_signature",
    "disallowed_algorithm",
    "unknown_key",
    "bad_signature",
];

struct Fixed {
    verifier: Verifier,
    required: Verifier,
    ed: Ed25519KeyPair,
    hmac: ring::hmac::Key,
    rule: SubjectPattern,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        // Single-threaded here (libFuzzer runs one input at a time).
        std::env::set_var(HMAC_ENV, B64.encode(HMAC_KEY));
        let ed = Ed25519KeyPair::from_seed_unchecked(&ED_SEED).expect("a seed");
        let rule = SubjectPattern::parse("signed.>").expect("a pattern");
        let cfg = |default_required| AuthenticityConfig {
            enabled: true,
            keys: vec![
                VerifyKeyEntry {
                    key_id: "h1".into(),
                    source: VerifyKeySource::HmacSecret(KeySource::Env(HMAC_ENV.into())),
                },
                VerifyKeyEntry {
                    key_id: "ed1".into(),
                    source: VerifyKeySource::Ed25519Inline(B64.encode(ed.public_key().as_ref())),
                },
            ],
            rules: vec![AuthRule {
                pattern: rule.clone(),
                required: true,
                algorithms: vec![Algorithm::Ed25519],
                key_ids: vec!["ed1".into()],
            }]
            .into(),
            default_required,
            ..Default::default()
        };
        Fixed {
            verifier: Verifier::load(&cfg(false)).expect("keys load"),
            required: Verifier::load(&cfg(true)).expect("keys load"),
            ed,
            hmac: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &HMAC_KEY),
            rule,
        }
    })
}

fn take(data: &mut &[u8]) -> String {
    let Some((&n, rest)) = data.split_first() else {
        return String::new();
    };
    let n = (n as usize).min(rest.len());
    let (head, tail) = rest.split_at(n);
    *data = tail;
    String::from_utf8_lossy(head).into_owned()
}

/// The signed bytes parse to exactly the three fields and are their own canonical form.
fn check_signed_bytes(id: Option<&str>, payload: &[u8], subject: &str) {
    let bytes = signed_bytes(id, payload, subject);
    let v: Value = serde_json::from_slice(&bytes).expect("signed bytes are JSON");
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 3);
    assert_eq!(obj["message_id"], id.map_or(Value::Null, Value::from));
    assert_eq!(obj["payload_sha256"], Value::from(hex_sha256(payload)));
    assert_eq!(obj["subject"], Value::from(subject));
    let mut canon = Vec::new();
    canonical_json(&mut canon, &v);
    assert_eq!(canon, bytes, "signed bytes are not canonical JSON");
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, mut rest)) = split_selector(data) else {
        return;
    };
    let f = fixed();
    let subject = take(&mut rest);
    let id = take(&mut rest);
    let mut alg = take(&mut rest);
    let mut key_id = take(&mut rest);
    let own_sig = take(&mut rest);
    let payload = rest.to_vec();
    let signer = sel >> 6;
    let id_header = (sel & 1 != 0).then_some(id.as_str());
    check_signed_bytes(id_header, &payload, &subject);
    let sig = match signer {
        0 => own_sig,
        s => {
            let signed = signed_bytes(id_header, &payload, &subject);
            let mut sig = if s == 2 {
                alg = "ed25519".into();
                key_id = "ed1".into();
                B64.encode(f.ed.sign(&signed).as_ref())
            } else {
                alg = "hmac-sha256".into();
                key_id = "h1".into();
                B64.encode(ring::hmac::sign(&f.hmac, &signed).as_ref())
            };
            if s == 3 {
                sig.push_str(&own_sig);
            }
            sig
        }
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    for (bit, name, value) in [
        (1, MESSAGE_ID_HEADER, &id),
        (2, "Svc-Signature-Alg", &alg),
        (4, "Svc-Signature-Key-Id", &key_id),
        (8, "Svc-Signature", &sig),
    ] {
        if sel & bit != 0 || (bit != 1 && signer != 0) {
            headers.push((name.to_string(), value.clone()));
        }
    }
    let repeated = sel & 16 != 0 && !headers.is_empty();
    if repeated {
        let h = headers[payload.len() % headers.len()].clone();
        headers.push(h);
    }
    let msg = RawMessage {
        stream: "S".into(),
        consumer: "c".into(),
        headers,
        data: payload.clone(),
        ..RawMessage::sample(&subject, 1, b"")
    };
    let verifier = if sel & 32 != 0 {
        &f.required
    } else {
        &f.verifier
    };
    let result = verifier.check(&msg);
    if let Err(e) = result {
        assert!(AuthFailure::ALL.contains(&e));
        assert!(CODES.contains(&e.code()), "undocumented code {}", e.code());
        assert_clean_display("authenticity failure", &e.to_string(), 200);
    }
    // The message id header the verifier reads (the first one) is the one signed, unless a
    // repeated header replaced it; a repeated signature header is refused anyway.
    let clean_signature = !repeated && (signer == 1 || signer == 2);
    match signer {
        0 => assert!(
            !matches!(result, Ok(AuthOutcome::Verified(_))),
            "an input's own signature verified: {result:?}"
        ),
        _ if clean_signature => {
            let expected = if signer == 1 && f.rule.matches(&subject) {
                Err(AuthFailure::DisallowedAlgorithm)
            } else if signer == 1 {
                Ok(AuthOutcome::Verified(Algorithm::HmacSha256))
            } else {
                Ok(AuthOutcome::Verified(Algorithm::Ed25519))
            };
            assert_eq!(result, expected, "a message the target signed");
        }
        _ => {}
    }
});
