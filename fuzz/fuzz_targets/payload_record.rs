//! Stored records read back by `svc decrypt` and `svc verify-custody` (src/cli/protect.rs,
//! src/message/protection/): files the service does not own; anyone who can edit the store
//! controls their bytes.
//!
//! Calls what the two commands run on a record file: `cli::protect::parse_records` (one
//! object, an array or JSON lines), then per record the strict reader
//! (`document::canonical::parse`), `Encryptor::decrypt_record`, `Custodian::verify` (keyed
//! and unkeyed) and `cli::protect::record_place` (the report line), and the canonical writer.
//! Keys are fixed test keys, set once through the environment variables the config names (as
//! a real config does).
//!
//! First byte even: the rest is the record file's text. First byte odd: the target itself
//! writes a record as `svc-normalize` does (`normalize`, `Encryptor::encrypt`,
//! `Custodian::seal`) from a stream, subject, sequence and payload taken from the input, then
//! alters it per bits 1-2 (nothing, sequence, subject, stream) before reading it back.
//!
//! Properties: no panic; every error (parse error, `CryptError`, unverifiable reason, report
//! line) is clean and bounded, and never holds a key's base64 or hex unless the input itself
//! does; a record that decrypts carries a string `stream` and `subject` and an integer
//! `stream_sequence`, its payload opens under exactly that AAD and not under a neighbouring
//! one; a random record never verifies under the keyed custodian, nor does any record whose
//! custody block says `sha256` (no downgrade); a record the target sealed decrypts to its
//! payload and verifies intact, and once moved (sequence, subject, stream) fails to decrypt
//! (`Open`) and verifies `Altered`; canonical JSON re-parses and is a fixed point.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use svc::cli::protect::{parse_records, record_place};
use svc::document::canonical::{self, Json};
use svc::message::envelope::{normalize, EnvelopeConfig, RawMessage};
use svc::message::protection::custody::{Custodian, CustodyConfig, Verdict};
use svc::message::protection::encryption::{
    aad, Action, CryptError, EncryptionConfig, Encryptor, KeyEntry,
};
use svc::message::protection::keys::KeySource;
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const ENC_ENV: &str = "SVC_FUZZ_PAYLOAD_KEY";
const CUSTODY_ENV: &str = "SVC_FUZZ_CUSTODY_KEY";

/// Distinctive bytes, so their encodings cannot occur by chance in an error text.
fn key_bytes(seed: u8) -> Vec<u8> {
    (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Keys {
    enc: Encryptor,
    keyed: Custodian,
    unkeyed: Custodian,
    /// Base64 and hex (lower and upper case) of both keys.
    secrets: Vec<String>,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let (ek, ck) = (key_bytes(11), key_bytes(200));
        // Single-threaded here (libFuzzer runs one input at a time, before any read).
        std::env::set_var(ENC_ENV, b64(&ek));
        std::env::set_var(CUSTODY_ENV, b64(&ck));
        let enc = Encryptor::load(&EncryptionConfig {
            enabled: true,
            keys: vec![KeyEntry {
                key_id: "k1".into(),
                source: KeySource::Env(ENC_ENV.into()),
            }],
            active_key_id: "k1".into(),
            digest_key_id: "k1".into(),
            default_action: Action::Encrypt,
            ..Default::default()
        })
        .expect("the fixed key loads");
        let custody = |key: Option<KeySource>| {
            Custodian::load(&CustodyConfig {
                enabled: true,
                runner_id: "fuzz-runner".into(),
                hmac_key: key,
                ..Default::default()
            })
            .expect("the fixed custody key loads")
        };
        let mut secrets = Vec::new();
        for k in [&ek, &ck] {
            secrets.push(b64(k));
            secrets.push(hex(k));
            secrets.push(hex(k).to_uppercase());
        }
        Keys {
            enc,
            keyed: custody(Some(KeySource::Env(CUSTODY_ENV.into()))),
            unkeyed: custody(None),
            secrets,
        }
    })
}

/// Clean, bounded, and no key material that the input did not already hold.
fn check_text(k: &Keys, what: &str, text: &str, input: &str) {
    assert_clean_display(what, text, MAX_ERROR_CHARS);
    for s in &k.secrets {
        assert!(
            !text.contains(s.as_str()) || input.contains(s.as_str()),
            "{what}: key material in {text:?}"
        );
    }
}

/// Canonical JSON re-parses strictly, and writing it again gives the same bytes.
fn check_canonical(v: &Json<'_>) {
    let mut once = Vec::new();
    canonical::write(&mut once, v);
    let text = std::str::from_utf8(&once).expect("canonical JSON is UTF-8");
    let back = canonical::parse(text).expect("canonical JSON parses");
    let mut twice = Vec::new();
    canonical::write(&mut twice, &back);
    assert_eq!(once, twice, "canonical JSON is not a fixed point");
}

/// Reads one record file's text as both commands do; returns each record's decryption and
/// verdict under the keyed custodian.
fn read_back(k: &Keys, text: &str) -> Vec<(Result<Vec<u8>, CryptError>, Verdict)> {
    let mut out = Vec::new();
    for (at, rec) in parse_records("store/records.jsonl", text) {
        check_text(k, "position", &at, text);
        let Ok(rec) = rec else { continue };
        let doc = match canonical::parse(rec) {
            Ok(doc) => doc,
            Err(e) => {
                check_text(k, "strict reader", &e.to_string(), text);
                continue;
            }
        };
        let place = record_place(&doc);
        if !place.is_empty() {
            check_text(k, "record_place", &place, text);
        }
        check_canonical(&doc);
        let Ok(v) = serde_json::from_str::<Value>(rec) else {
            continue;
        };
        let dec = k.enc.decrypt_record(&v);
        match &dec {
            Ok(plain) => {
                let stream = v["stream"].as_str().expect("decrypted: stream is a string");
                let subject = v["subject"]
                    .as_str()
                    .expect("decrypted: subject is a string");
                let seq = v["stream_sequence"]
                    .as_u64()
                    .expect("decrypted: stream_sequence is an integer");
                let again = k
                    .enc
                    .decrypt_payload(&v["payload"], &aad(stream, seq, subject))
                    .expect("opens under its own AAD");
                assert_eq!(&again, plain);
                let moved = k
                    .enc
                    .decrypt_payload(&v["payload"], &aad(stream, seq.wrapping_add(1), subject));
                assert_eq!(moved, Err(CryptError::Open), "opens under another sequence");
            }
            Err(e) => check_text(k, "decrypt_record", &e.to_string(), text),
        }
        let unkeyed = k.unkeyed.verify(&doc);
        let keyed = k.keyed.verify(&doc);
        let alg = doc
            .get("custody")
            .and_then(|c| c.get("alg"))
            .and_then(Json::as_str);
        if alg != Some("hmac-sha256") {
            assert_ne!(keyed, Verdict::Intact, "an unkeyed block verified under a key");
        }
        for verdict in [&keyed, &unkeyed] {
            if let Verdict::Unverifiable(why) = verdict {
                check_text(k, "verify", why, text);
            }
        }
        out.push((dec, keyed));
    }
    out
}

fn take<'a>(data: &mut &'a [u8]) -> &'a [u8] {
    let Some((&n, rest)) = data.split_first() else {
        return &[];
    };
    let n = (n as usize).min(rest.len());
    let (head, tail) = rest.split_at(n);
    *data = tail;
    head
}

fn seal_and_read(k: &Keys, sel: u8, mut data: &[u8]) {
    let stream = String::from_utf8_lossy(take(&mut data)).into_owned();
    let subject = String::from_utf8_lossy(take(&mut data)).into_owned();
    let seq = take(&mut data)
        .iter()
        .fold(0u64, |a, &b| a.wrapping_mul(256).wrapping_add(b as u64));
    let msg = RawMessage {
        stream: stream.as_str().into(),
        consumer_sequence: 1,
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        headers: vec![("Nats-Msg-Id".into(), "m-1".into())],
        ..RawMessage::sample(&subject, seq, data)
    };
    let (mut env, _) = normalize(&msg, 1_700_000_001_000_000_000, &EnvelopeConfig::default());
    let plain = env.payload.json().as_bytes().to_vec();
    k.enc.encrypt(&mut env, &msg.data).expect("encrypts");
    k.keyed.seal(&mut env, &msg.data, 1_700_000_001_500_000_000);
    // Moved after sealing; serialized from the envelope itself, so the payload keeps its
    // exact text (numbers beyond a double included), as the sinks store it.
    let moved = (sel >> 1) & 3;
    match moved {
        0 => {}
        1 => env.stream_sequence = seq.wrapping_add(1),
        2 => env.subject = format!("{subject}.x"),
        _ => env.stream = format!("{stream}x").as_str().into(),
    }
    // A JSON lines file, or one pretty-printed object.
    let text = if sel & 8 != 0 {
        serde_json::to_string_pretty(&env).expect("serializes")
    } else {
        serde_json::to_string(&env).expect("serializes") + "\n"
    };
    let results = read_back(k, &text);
    assert_eq!(results.len(), 1, "one record written, one read");
    let (dec, verdict) = &results[0];
    if moved == 0 {
        assert_eq!(dec.as_deref(), Ok(plain.as_slice()), "own record decrypts");
        assert_eq!(*verdict, Verdict::Intact, "own record verifies");
    } else {
        assert_eq!(*dec, Err(CryptError::Open), "moved record decrypts");
        assert_eq!(*verdict, Verdict::Altered, "moved record verifies");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let k = keys();
    if sel & 1 == 1 {
        seal_and_read(k, sel, rest);
        return;
    }
    // `svc decrypt` reads text (a file that is not UTF-8 fails its read).
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    for (_, verdict) in read_back(k, text) {
        assert_ne!(
            verdict,
            Verdict::Intact,
            "a record the target did not seal verifies under the keyed custodian"
        );
    }
});
