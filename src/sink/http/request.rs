//! What a request carries: one record per message, records grouped into request bodies
//! (`none`, `json_array`, `ndjson`) within the batch bounds, idempotency keys, gzip, and the
//! headers (static, secret, forwarded, signature).
//!
//! Everything here is a deterministic function of the messages, so a redelivery sends the
//! same records under the same keys (the signature's timestamp is the one part that moves).

use std::io::Write;

use flate2::write::GzEncoder;

use super::config::{Batching, BodyMode, HttpSinkConfig};
use super::signature::Signer;
use crate::message::envelope::{hex_sha256, Envelope};
use crate::message::record::{encode_record, record_capacity};
use crate::sink::key::push_stream_place;
use crate::sink::FailureClass;
use crate::text::json::push_str;
use crate::text::secret_bytes::{wipe_string, SecretString};

/// One message, encoded.
#[derive(Debug, Clone)]
pub struct Record {
    /// `nats:<stream>:<sequence>`: the same for every delivery of the message.
    pub key: String,
    /// The record as it goes into a body (with its `idempotency_key` field when batched).
    pub bytes: Vec<u8>,
    /// Forwarded NATS headers (`keep_headers`, `batching: none` only).
    pub headers: Vec<(String, String)>,
}

/// The idempotency key of one message: stream and stream sequence identify it in JetStream
/// whatever the delivery. The stream name is escaped to stay a plain header value.
///
/// `nats:` and what [`stream_place`](crate::message::envelope::stream_place) makes of the
/// escaped stream, the incarnation and the sequence with `:`, written into one string (the
/// `format!`s and their temporary strings cost more than the text, once per record). The
/// incarnation is `compact_utc`'s text, which escaping leaves as it is.
pub fn message_key(env: &Envelope) -> String {
    let mut key = String::with_capacity(32 + 3 * env.stream.len() + env.stream_incarnation.len());
    key.push_str("nats:");
    push_stream_place(&mut key, env, ':');
    key
}

/// The key of a request of several records: a digest of their keys in order. A redelivered
/// batch of the same messages gets the same key; receivers that split differently batched
/// redeliveries use the per-record `idempotency_key`.
pub fn batch_key(records: &[&Record]) -> String {
    if let [one] = records {
        return one.key.clone();
    }
    let mut joined = Vec::with_capacity(records.len() * 24);
    for r in records {
        joined.extend_from_slice(r.key.as_bytes());
        joined.push(b'\n');
    }
    format!("batch:{}", &hex_sha256(&joined)[..32])
}

/// Encodes one message. An error is permanent for this message alone, with its class.
pub fn record(cfg: &HttpSinkConfig, env: &Envelope) -> Result<Record, (String, FailureClass)> {
    let key = message_key(env);
    let mut bytes = Vec::with_capacity(32 + key.len() + record_capacity(env));
    let batched = cfg.batching != Batching::None;
    let encoded = match (cfg.body, batched) {
        (BodyMode::Envelope, false) => encode_record(&mut bytes, env),
        (BodyMode::Envelope, true) => {
            // `{"idempotency_key":"..."` then the record, whose opening brace becomes the
            // comma: one pass over the record, no second copy.
            bytes.extend_from_slice(b"{\"idempotency_key\":");
            push_str(&mut bytes, &key);
            let brace = bytes.len();
            let r = encode_record(&mut bytes, env);
            if r.is_ok() {
                bytes[brace] = b',';
            }
            r
        }
        (BodyMode::Payload, false) => {
            bytes.extend_from_slice(env.payload.json().as_bytes());
            Ok(())
        }
        (BodyMode::Payload, true) => {
            bytes.extend_from_slice(b"{\"idempotency_key\":");
            push_str(&mut bytes, &key);
            bytes.extend_from_slice(b",\"payload\":");
            bytes.extend_from_slice(env.payload.json().as_bytes());
            bytes.push(b'}');
            Ok(())
        }
    };
    if let Err(e) = encoded {
        return Err((
            format!("{key}: cannot encode the record: {e}"),
            FailureClass::EncodeFailed,
        ));
    }
    if bytes.len() > cfg.max_request_bytes {
        return Err((
            format!(
                "{key}: record is {} bytes, over max_request_bytes ({})",
                bytes.len(),
                cfg.max_request_bytes
            ),
            FailureClass::TooLarge,
        ));
    }
    let headers = cfg
        .keep_headers
        .iter()
        .filter_map(|name| {
            env.metadata
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .filter(|(_, v)| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
                .map(|(_, v)| (name.clone(), v.clone()))
        })
        .collect();
    Ok(Record {
        key,
        bytes,
        headers,
    })
}

/// Groups records (given as indexes into `sizes`, in batch order) into requests: one each
/// with `none`; else consecutive runs of at most `max_batch_messages` records whose body stays
/// within `max_batch_bytes` (a record larger than that goes alone).
///
/// The records are spread evenly over the fewest requests `max_batch_messages` allows (256
/// records at 100: 86, 85, 85, not 100, 100, 56): the batch is done when its last request is,
/// and a short request would leave its request thread idle while the long ones finish.
pub fn group(cfg: &HttpSinkConfig, indexes: &[usize], sizes: &[usize]) -> Vec<Vec<usize>> {
    if cfg.batching == Batching::None {
        return indexes.iter().map(|i| vec![*i]).collect();
    }
    // Records of a request starting with `left` records to place: the fewest requests for
    // them, evenly (never above max_batch_messages; a byte cut re-plans what is left).
    let even = |left: usize| left.div_ceil(left.div_ceil(cfg.max_batch_messages).max(1));
    let mut cap = even(indexes.len());
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    // Framing: `[`, `]` and a `,` per record for an array; a `\n` per record for ndjson.
    let mut bytes = 2;
    for (placed, &i) in indexes.iter().enumerate() {
        let add = sizes[i] + 1;
        if !current.is_empty() && (current.len() >= cap || bytes + add > cfg.max_batch_bytes) {
            out.push(std::mem::take(&mut current));
            bytes = 2;
            cap = even(indexes.len() - placed);
        }
        current.push(i);
        bytes += add;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// A request ready to send (and to send again, as is, on a retry).
#[derive(Debug, Clone)]
pub struct Request {
    pub key: String,
    /// The body as sent (gzipped when on).
    pub body: Vec<u8>,
    /// The uncompressed body when `body` is gzipped: what the signature covers (Standard
    /// Webhooks signs the payload as text; receivers verify it after decoding the transfer).
    pub plain: Option<Vec<u8>>,
    pub content_type: &'static str,
    pub gzip: bool,
    /// Forwarded NATS headers (one record only).
    pub forwarded: Vec<(String, String)>,
}

pub fn content_type(cfg: &HttpSinkConfig) -> &'static str {
    match cfg.batching {
        Batching::Ndjson => "application/x-ndjson",
        _ => "application/json",
    }
}

/// The request of `records` (non-empty).
pub fn build(cfg: &HttpSinkConfig, records: &[&Record]) -> std::io::Result<Request> {
    let mut body = Vec::with_capacity(records.iter().map(|r| r.bytes.len() + 1).sum::<usize>() + 2);
    match cfg.batching {
        Batching::None => body.extend_from_slice(&records[0].bytes),
        Batching::JsonArray => {
            body.push(b'[');
            for (i, r) in records.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(&r.bytes);
            }
            body.push(b']');
        }
        Batching::Ndjson => {
            for r in records {
                body.extend_from_slice(&r.bytes);
                body.push(b'\n');
            }
        }
    }
    let mut plain = None;
    if cfg.gzip {
        let zipped = gzip(&body)?;
        plain = Some(std::mem::replace(&mut body, zipped));
    }
    Ok(Request {
        key: batch_key(records),
        body,
        plain,
        content_type: content_type(cfg),
        gzip: cfg.gzip,
        forwarded: if records.len() == 1 {
            records[0].headers.clone()
        } else {
            Vec::new()
        },
    })
}

/// Every header of a request but Host and Content-Length: static ones, secret ones, the
/// forwarded ones, the idempotency key and, when signing, the Standard Webhooks headers.
pub fn headers(
    cfg: &HttpSinkConfig,
    secret_headers: &[(String, SecretString)],
    signer: Option<&Signer>,
    req: &Request,
    unix_seconds: u64,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(8 + cfg.headers.len());
    out.push(("content-type".into(), req.content_type.into()));
    if req.gzip {
        out.push(("content-encoding".into(), "gzip".into()));
    }
    out.push((cfg.idempotency_header.clone(), req.key.clone()));
    for (k, v) in &cfg.headers {
        out.push((k.clone(), v.clone()));
    }
    out.extend(req.forwarded.iter().cloned());
    add_secret_headers(&mut out, secret_headers);
    if let Some(s) = signer {
        let signed = s.sign(
            &req.key,
            unix_seconds,
            req.plain.as_ref().unwrap_or(&req.body),
        );
        out.push(("webhook-id".into(), signed.id));
        out.push(("webhook-timestamp".into(), signed.timestamp));
        out.push(("webhook-signature".into(), signed.signature));
    }
    out
}

/// Appends the `headers_env` headers. Their values are copies of secrets: a caller wipes the
/// list once the request is sent ([`wipe_header_values`]).
pub fn add_secret_headers(out: &mut Vec<(String, String)>, secret: &[(String, SecretString)]) {
    out.extend(
        secret
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string())),
    );
}

/// Wipes every value of a request's header list (`crate::text::secret_bytes`): the secret
/// ones among them are copies made for this request.
pub fn wipe_header_values(headers: &mut [(String, String)]) {
    headers.iter_mut().for_each(|(_, v)| wipe_string(v));
}

/// Deterministic gzip (no name, zero mtime): a retry sends the same bytes.
pub fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = GzEncoder::new(
        Vec::with_capacity(data.len() / 2 + 64),
        flate2::Compression::fast(),
    );
    enc.write_all(data)?;
    enc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::http::config::HttpSinkConfig;

    pub(crate) fn cfg(extra: &str) -> HttpSinkConfig {
        let v: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"type": "http", "url": "https://h.example/" {extra}}}"#
        ))
        .unwrap();
        let problems = crate::document::reader::Problems::new();
        match crate::sink::SinkConfig::read(crate::document::reader::ObjectReader::at(
            "sink".into(),
            &v,
            &problems,
        )) {
            Some(crate::sink::SinkConfig::Http(c)) if problems.is_empty() => *c,
            _ => {
                let shown: Vec<String> =
                    problems.into_vec().iter().map(|p| p.to_string()).collect();
                panic!("bad test config: {}", shown.join("; "))
            }
        }
    }

    fn rec(key: &str, n: usize) -> Record {
        Record {
            key: key.into(),
            bytes: vec![b'x'; n],
            headers: Vec::new(),
        }
    }

    fn envelope(seq: u64, payload: &[u8]) -> Envelope {
        use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
        normalize(
            &RawMessage {
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                ..RawMessage::sample("orders.created", seq, payload)
            },
            1_700_000_001_000_000_000,
            &EnvelopeConfig::default(),
        )
        .0
    }

    #[test]
    fn records_carry_their_key_and_an_oversized_one_fails_alone() {
        let env = envelope(42, br#"{"order":42}"#);
        let batched = record(&cfg(""), &env).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&batched.bytes).unwrap();
        assert_eq!(v["idempotency_key"], "nats:ORDERS:42");
        let mut again = env.clone();
        again.stream_incarnation = "20261128T071943Z".into();
        assert_eq!(message_key(&again), "nats:ORDERS:20261128T071943Z:42");
        assert_eq!(v["schema"], "svc.file.message.v1");
        assert_eq!(v["payload"]["order"], 42);
        let alone = record(&cfg(r#", "batching": "none", "body": "payload""#), &env).unwrap();
        assert_eq!(alone.bytes, br#"{"order":42}"#);
        let small = cfg(r#", "max_batch_bytes": 1024, "max_request_bytes": 1024"#);
        let big = envelope(7, format!(r#"{{"pad":"{}"}}"#, "x".repeat(2000)).as_bytes());
        let (why, class) = record(&small, &big).unwrap_err();
        assert_eq!(class, FailureClass::TooLarge);
        assert!(why.starts_with("nats:ORDERS:7: record is "), "{why}");
        assert!(!why.contains("xxxx"), "no payload in the reason: {why}");
    }

    #[test]
    fn message_keys_are_what_the_formatted_keys_were() {
        use crate::message::envelope::stream_place;
        use crate::sink::key::safe_component;
        let mut env = envelope(1, b"{}");
        for stream in ["ORDERS", "a.b", ".x", "", "s p~é:", "\u{7f}\u{0}"] {
            for incarnation in ["", "20261128T071943Z", "20261128T071943.123456789Z"] {
                for seq in [0, 7, 42, 1_000_000, u64::MAX] {
                    env.stream = stream.into();
                    env.stream_incarnation = incarnation.into();
                    env.stream_sequence = seq;
                    let before = format!(
                        "nats:{}",
                        stream_place(&safe_component(stream), incarnation, seq, ":")
                    );
                    assert_eq!(message_key(&env), before);
                    let mut bytes = Vec::new();
                    push_str(&mut bytes, &before);
                    assert_eq!(bytes, serde_json::to_vec(&before).unwrap());
                }
            }
        }
    }

    #[test]
    fn groups_respect_message_and_byte_bounds_and_keep_order() {
        let c = cfg(r#", "max_batch_messages": 3, "max_batch_bytes": 1024"#);
        let sizes = vec![100, 100, 100, 100, 900, 2000, 10];
        let idx: Vec<usize> = (0..sizes.len()).collect();
        assert_eq!(
            group(&c, &idx, &sizes),
            vec![vec![0, 1, 2], vec![3, 4], vec![5], vec![6]]
        );
        let none = cfg(r#", "batching": "none""#);
        assert_eq!(group(&none, &[2, 5], &sizes), vec![vec![2], vec![5]]);
        // Spread evenly over the fewest requests the message bound allows.
        let lengths = |n: usize, max: usize| -> Vec<usize> {
            let c = cfg(&format!(r#", "max_batch_messages": {max}"#));
            let idx: Vec<usize> = (0..n).collect();
            let groups = group(&c, &idx, &vec![10; n]);
            let flat: Vec<usize> = groups.iter().flatten().copied().collect();
            assert_eq!(flat, idx, "every record once, in order");
            groups.iter().map(Vec::len).collect()
        };
        assert_eq!(lengths(256, 100), vec![86, 85, 85]);
        assert_eq!(lengths(200, 100), vec![100, 100]);
        assert_eq!(lengths(101, 100), vec![51, 50]);
        assert_eq!(lengths(64, 100), vec![64]);
        assert_eq!(lengths(7, 3), vec![3, 2, 2]);
        assert_eq!(lengths(10_000, 10_000), vec![10_000]);
    }

    #[test]
    fn bodies_frame_records_and_keys_are_stable() {
        let (a, b) = (rec("nats:S:1", 2), rec("nats:S:2", 3));
        let arr = build(&cfg(""), &[&a, &b]).unwrap();
        assert_eq!(arr.body, b"[xx,xxx]");
        assert_eq!(arr.content_type, "application/json");
        let nd = build(&cfg(r#", "batching": "ndjson""#), &[&a, &b]).unwrap();
        assert_eq!(nd.body, b"xx\nxxx\n");
        assert_eq!(nd.content_type, "application/x-ndjson");
        assert_eq!(arr.key, nd.key);
        assert!(arr.key.starts_with("batch:") && arr.key.len() == 38);
        assert_ne!(batch_key(&[&b, &a]), arr.key);
        assert_eq!(build(&cfg(""), &[&a]).unwrap().key, "nats:S:1");
        let gz = build(&cfg(r#", "gzip": true"#), &[&a, &b]).unwrap();
        assert_eq!(
            gz.body,
            build(&cfg(r#", "gzip": true"#), &[&a, &b]).unwrap().body
        );
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz.body[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, b"[xx,xxx]");
    }
}
