//! Messages made in-process, for tests that call a sink or the publisher directly instead of
//! going through a broker.

use svc::message::envelope::RawMessage;

/// A first delivery from stream `ORDERS` to consumer `svc`, consumer sequence equal to the
/// stream's, no headers, no publish time. Tests change what they care about with struct
/// update syntax: `RawMessage { headers, ..raw("a.b", 1, b"{}") }`.
pub fn raw(subject: &str, seq: u64, data: &[u8]) -> RawMessage {
    RawMessage {
        subject: subject.into(),
        stream: "ORDERS".into(),
        consumer: "svc".into(),
        stream_sequence: seq,
        consumer_sequence: seq,
        delivery_count: 1,
        published_unix_nanos: None,
        headers: Vec::new(),
        data: data.to_vec(),
        unreadable: None,
    }
}
